"""Code samples taken from the Markdown as it stands, so the docs' tests run what people read."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def code_blocks(language: str, doc: Path = README) -> list[str]:
    """Every fenced block in `language` of `doc`, in order."""
    return [m.group(1) for m in re.finditer(rf"```{language}\n(.*?)```", doc.read_text(), re.S)]


def run_python(
    source: str, cwd: Path, *, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a sample as a script in `cwd`, as a reader would: no store or model configured
    (unless `env`, the whole environment, says otherwise)."""
    script = cwd / "sample.py"
    script.write_text(source)
    if env is None:
        env = {
            k: v for k, v in os.environ.items() if k not in ("CONTEXTOS_STORE", "CONTEXTOS_MODEL")
        }
    return subprocess.run(
        [sys.executable, str(script)], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


SAMPLE_LANGUAGES = ("python", "bash")
"""The fences whose samples the suite runs (other fences are data: JSON, TOML, SQL, output)."""

_MARKER = re.compile(r"<!-- sample: (skip|covered by) (.+?) -->\n$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Sample:
    """One fenced code sample of a page, with what the line before it says about running it."""

    page: Path
    line: int
    language: str
    code: str
    mark: str | None = None
    """None (the page's sample test runs it), "skip" or "covered by"."""
    why: str = ""
    """The reason it is skipped, or the test (path::name) that runs it."""

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def samples(page: Path) -> list[Sample]:
    """Every Python and shell sample of `page`, in order."""
    text = page.read_text()
    found: list[Sample] = []
    for m in re.finditer(r"^```(\w+)\n(.*?)^```", text, re.S | re.M):
        if m.group(1) not in SAMPLE_LANGUAGES:
            continue
        before = text[: m.start()]
        previous = before[before.rstrip("\n").rfind("\n") + 1 :] if before else ""
        marker = _MARKER.search(previous.rstrip("\n") + "\n")
        found.append(
            Sample(
                page=page,
                line=before.count("\n") + 1,
                language=m.group(1),
                code=m.group(2),
                mark=marker.group(1) if marker else None,
                why=marker.group(2).strip() if marker else "",
            )
        )
    return found


def pages() -> list[Path]:
    """README.md and every page of docs/."""
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def run_page(
    page: Path, cwd: Path, *, timeout: float = 300
) -> list[tuple[str, subprocess.CompletedProcess[str]]]:
    """Run a page's blocks as a reader would, in one directory, in order; each shell line with
    its result.

    A block whose first line is `# NAME.ext` is saved as that file; a Python block runs, and
    when the page follows it with "prints" and a block, it must print exactly that; a shell
    line must exit 0 (1 when it ends `# exits 1`) without a traceback; `export K=V` sets the
    environment of the lines after it. No store, policy or capture mode is configured."""
    text = page.read_text()
    env = {
        **os.environ,
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }
    for name in ("CONTEXTOS_STORE", "CONTEXTOS_POLICY", "CONTEXTOS_OTEL_CAPTURE_CONTENT"):
        env.pop(name, None)
    shell: list[tuple[str, subprocess.CompletedProcess[str]]] = []
    found = list(re.finditer(r"```(\w*)\n(.*?)```", text, re.S))
    for i, block in enumerate(found):
        lang, body = block.group(1), block.group(2)
        named = re.fullmatch(r"# (\S+\.\w+)", body.splitlines()[0])
        if named:
            (cwd / named.group(1)).write_text(body)
        elif lang == "python":
            done = subprocess.run(
                [sys.executable, "-c", body],
                cwd=cwd,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
            assert done.returncode == 0, f"block {i}:\n{done.stderr}"
            after = found[i + 1] if i + 1 < len(found) else None
            if after is not None and text[block.end() : after.start()] == "\n\nprints\n\n":
                assert done.stdout == after.group(2), f"block {i} printed:\n{done.stdout}"
        elif lang == "bash":
            for line in body.splitlines():
                if line.startswith("export "):
                    key, _, value = line.removeprefix("export ").partition("=")
                    env[key] = value
                    continue
                expected = 1 if line.endswith("# exits 1") else 0
                done = subprocess.run(
                    ["bash", "-c", line],
                    cwd=cwd,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
                assert done.returncode == expected, f"{line}\n{done.stdout}\n{done.stderr}"
                assert "Traceback" not in done.stderr, line
                shell.append((line, done))
    return shell
