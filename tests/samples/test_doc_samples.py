"""Every Python and shell sample of README.md and docs/*.md runs, taken from the Markdown.

A sample runs here, with the others of its page in order, in one folder with one store; or
the line before its fence says why not: `<!-- sample: skip (reason) -->`, or
`<!-- sample: covered by tests/path.py::test_name -->` when a test of its own runs it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.markdown import ROOT, Sample, pages, run_python, samples

RUN_HERE = {
    page.relative_to(ROOT).as_posix(): [s for s in samples(page) if s.mark is None]
    for page in pages()
}


def test_every_sample_runs_here_or_says_why_not() -> None:
    marked = [s for page in pages() for s in samples(page) if s.mark is not None]
    for s in marked:
        if s.mark == "skip":
            assert re.fullmatch(r"\(\S.*\)", s.why), f"{s.where}: a skip gives its reason"
            continue
        path, sep, name = s.why.partition("::")
        assert sep and (ROOT / path).is_file(), f"{s.where}: no test file {path}"
        defined = re.search(rf"^(async )?def {re.escape(name)}\(", (ROOT / path).read_text(), re.M)
        assert defined, f"{s.where}: {path} has no test {name}"
    assert sum(len(run) for run in RUN_HERE.values()) >= 10  # the rest run below


def environment(folder: Path) -> dict[str, str]:
    """A reader's shell: `contextos` on PATH, a store of the page's own, nothing else set."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("CONTEXTOS_") or k == "CONTEXTOS_TEST_POSTGRES"
    }
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        CONTEXTOS_STORE=f"sqlite:///{folder}/runs.db",
        NO_COLOR="1",
        COLUMNS="100",
    )
    return env


def run(sample: Sample, folder: Path) -> subprocess.CompletedProcess[str]:
    if sample.language == "python":
        return run_python(sample.code, folder, env=environment(folder))
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", sample.code],
        cwd=folder,
        env=environment(folder),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("page", [p for p, run in RUN_HERE.items() if run])
def test_the_samples_of_a_page_run(page: str, tmp_path: Path) -> None:
    for name in ("examples", "tests"):  # the paths samples name, as from the project's root
        (tmp_path / name).symlink_to(ROOT / name)
    for sample in RUN_HERE[page]:
        done = run(sample, tmp_path)
        assert done.returncode == 0, f"{sample.where}:\n{done.stdout}\n{done.stderr}"
