"""`python -m bench`: build the benchmark's own environment, then run the suite in it.

The peers are installed into bench/.venv (pinned in bench/requirements.txt, with ContextOS
itself editable from this checkout, its bytecode written before each run as pip writes the
peers'); the suite then runs under that interpreter.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "bench" / ".venv"
REQUIREMENTS = ROOT / "bench" / "requirements.txt"
STAMP = VENV / ".installed"


def _venv_python() -> Path:
    return VENV / "bin" / "python"


def _wanted() -> str:
    digest = hashlib.sha256()
    for path in (REQUIREMENTS, ROOT / "pyproject.toml"):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def ensure_venv() -> Path:
    """Create bench/.venv and install the pinned peers and ContextOS, unless already done."""
    python = _venv_python()
    wanted = _wanted()
    if python.exists() and STAMP.exists() and STAMP.read_text() == wanted:
        return python
    if not python.exists():
        print(f"bench: creating {VENV.relative_to(ROOT)}", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    print("bench: installing the peers (bench/requirements.txt) and contextos", file=sys.stderr)
    subprocess.run(
        [
            str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
            "-r", str(REQUIREMENTS), "-e", f"{ROOT}[postgres]",
        ],
        check=True,
    )  # fmt: skip
    STAMP.write_text(wanted)
    return python


def compile_checkout(python: Path) -> None:
    """Write the bytecode of this checkout's sources, as pip writes the peers' at install.

    An editable install leaves it to the first import, which never writes it when
    PYTHONDONTWRITEBYTECODE is set: every fresh process of the suite would then compile
    ContextOS from source (about 0.25 s here) while it loads the peers' compiled files.
    Only sources changed since the last run are compiled again.
    """
    subprocess.run(
        [str(python), "-m", "compileall", "-q", str(ROOT / "src" / "contextos")],
        check=True,
    )


def main() -> None:
    if Path(sys.prefix).resolve() != VENV.resolve():
        python = ensure_venv()
        os.chdir(ROOT)
        os.execv(str(python), [str(python), "-m", "bench", *sys.argv[1:]])
    compile_checkout(Path(sys.executable))
    from bench.run import main as run

    run(sys.argv[1:])


if __name__ == "__main__":
    main()
