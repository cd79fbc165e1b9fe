from contextos.cli import main

main()
