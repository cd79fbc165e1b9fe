"""`python -m contextos.workers`: run a worker (the same as `contextos worker`)."""

import sys

from contextos.workers.worker import main

sys.exit(main())
