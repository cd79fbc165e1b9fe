"""Skills, disclosed progressively: only the catalog is in the prompt, bodies on request.

A skill is a directory with a `SKILL.md` whose frontmatter names it and says when to use it
(`name` up to 64 characters, `description` up to 1024). The catalog (name, description, path)
goes into the stable prefix of every call; a skill's body enters the conversation only when
the model calls the `read_skill` tool, and is then trusted as the agent author's text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from contextos.context.compiled import ContextItem, ItemType, TrustClass, sha
from contextos.errors import ConfigError
from contextos.middleware.base import BaseMiddleware, ModelCall, ModelHandler, ModelResult
from contextos.tools.contract import Tool, tool

_NAME = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Skill:
    """One skill: its frontmatter, where it lives, and its body."""

    name: str
    """Lowercase letters, digits and hyphens, at most 64 characters."""
    description: str
    """What it does and when to use it, at most 1024 characters."""
    path: Path
    """The SKILL.md file."""
    body: str
    """Everything after the frontmatter."""
    version: str
    """Hash of the whole file."""
    metadata: dict[str, str] = field(default_factory=dict)
    """Other frontmatter keys, as written."""


def parse_frontmatter(text: str, *, origin: str = "SKILL.md") -> tuple[dict[str, str], str]:
    """Split `---`-fenced frontmatter (simple `key: value` YAML) from the body."""
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise ConfigError(f"{origin}: a skill starts with a `---` frontmatter block", path=origin)
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    except StopIteration:
        raise ConfigError(f"{origin}: the frontmatter block is not closed", path=origin) from None
    data: dict[str, str] = {}
    i = 1
    while i < end:
        line = lines[i]
        i += 1
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        key, sep, value = line.partition(":")
        if not sep or line[0].isspace():
            raise ConfigError(f"{origin}: cannot read frontmatter line {line!r}", path=origin)
        value = value.strip()
        if value in ("|", ">", "|-", ">-"):
            block: list[str] = []
            while i < end and (not lines[i].strip() or lines[i][0].isspace()):
                block.append(lines[i].strip())
                i += 1
            value = ("\n" if value.startswith("|") else " ").join(block).strip()
        elif len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        data[key.strip()] = value
    return data, "\n".join(lines[end + 1 :]).strip()


def load_skill(path: str | Path) -> Skill:
    path = Path(path)
    text = path.read_text(encoding="utf-8")
    meta, body = parse_frontmatter(text, origin=str(path))
    name = meta.pop("name", "")
    description = meta.pop("description", "")
    if not _NAME.match(name) or len(name) > 64:
        raise ConfigError(
            f"{path}: skill name {name!r} must be 1-64 lowercase letters, digits or hyphens",
            path=str(path),
        )
    if not description or len(description) > 1024:
        raise ConfigError(
            f"{path}: a skill needs a description of at most 1024 characters", path=str(path)
        )
    return Skill(
        name=name,
        description=description,
        path=path,
        body=body,
        version=sha(text)[:12],
        metadata=meta,
    )


def discover(roots: Sequence[str | Path]) -> list[Skill]:
    """Every `SKILL.md` under the roots (a root may also be one SKILL.md file)."""
    found: list[Skill] = []
    for root in map(Path, roots):
        if root.is_file():
            files = [root]
        elif root.is_dir():
            files = sorted(root.rglob("SKILL.md"))
        else:
            raise ConfigError(f"no skills directory at {root}", path=str(root))
        found.extend(load_skill(f) for f in files)
    names = [s.name for s in found]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"two skills share the name {dupes[0]!r}", name=dupes[0])
    return sorted(found, key=lambda s: s.name)


class Skills(BaseMiddleware):
    """Puts the skill catalog in the prompt and serves bodies through a tool."""

    name = "skills"
    platform_slot = 5

    def __init__(
        self, *roots: str | Path, tool_name: str = "read_skill", select: int | None = None
    ) -> None:
        """`select`: list only the skills (at most that many) whose name or description shares
        words with the run's task, each with the words that chose it; None lists them all."""
        self.skills = {s.name: s for s in discover(roots)}
        self.tool_name = tool_name
        self.select = select
        self._tool = self._make_tool()

    def fingerprint(self) -> dict[str, Any]:
        return {
            "tool": self.tool_name,
            "skills": [[s.name, s.version] for s in self.skills.values()],
            **({"select": self.select} if self.select is not None else {}),
        }

    def chosen(self, task: str) -> tuple[list[tuple[Skill, str]], list[tuple[Skill, str]]]:
        """(skill, why) for the skills listed for this task, and for those left out."""
        if self.select is None:
            return [(s, "") for s in self.skills.values()], []
        wanted = _words(task)
        scored = []
        for skill in self.skills.values():
            shared = sorted(w for w in wanted if _matches(w, _words(skill.name, skill.description)))
            scored.append((len(shared), skill, shared))
        scored.sort(key=lambda t: (-t[0], t[1].name))
        keep, drop = [], []
        for rank, (score, skill, shared) in enumerate(scored):
            if score and rank < self.select:
                keep.append((skill, "the task says " + ", ".join(shared)))
            elif score:
                drop.append((skill, f"ranked below the {self.select} chosen for the task"))
            else:
                drop.append((skill, "no word of the task matches its name or description"))
        return keep, drop

    def tools(self) -> tuple[Tool, ...]:
        return (self._tool,) if self.skills else ()

    @property
    def trusted_tools(self) -> frozenset[str]:
        """Tool results written by the agent's author, not by the outside world."""
        return frozenset({self.tool_name}) if self.skills else frozenset()

    def catalog(self, listed: Sequence[tuple[Skill, str]] | None = None) -> ContextItem | None:
        shown = [s for s, _ in listed] if listed is not None else list(self.skills.values())
        if not shown:
            return None
        lines = [
            f"Skills you can use. Before following one, read its full text with the "
            f"`{self.tool_name}` tool:"
        ]
        lines += [f"- {s.name}: {s.description} ({s.path.parent.name}/SKILL.md)" for s in shown]
        content = "\n".join(lines)
        reasons = "; ".join(f"{s.name}: {why}" for s, why in listed or () if why)
        return ContextItem(
            id="skill_catalog",
            type=ItemType.SKILL_CATALOG,
            content=content,
            source="skills:" + ",".join(s.name for s in shown),
            version=sha("".join(s.version for s in shown))[:12],
            trust=TrustClass.DEVELOPER,
            why=f"{len(shown)} skills; bodies are read on demand"
            + (f"; chosen for the task ({reasons})" if reasons else ""),
        )

    async def wrap_model_call(self, call: ModelCall, call_next: ModelHandler) -> ModelResult:
        history = call.context.history
        task = history[0].message.content if history else ""
        listed, left_out = self.chosen(task)
        item = self.catalog(listed)
        context = call.context.drop(
            *(
                {
                    "id": f"skill:{s.name}",
                    "type": ItemType.SKILL_CATALOG.value,
                    "source": f"{s.path.parent.name}/SKILL.md",
                    "why": why,
                }
                for s, why in left_out
            )
        )
        if item is not None:
            context = context.add(item)
        result = await call_next(call.with_context(context))
        return result.with_telemetry(**{"skills.catalog": len(listed)})

    def _make_tool(self) -> Tool:
        skills = self.skills

        def read_skill(name: str) -> str:
            skill = skills.get(name)
            if skill is None:
                known = ", ".join(skills) or "none"
                raise ValueError(f"there is no skill named {name!r}; skills: {known}")
            return f"# Skill: {skill.name} ({skill.version})\n\n{skill.body}"

        return tool(
            name=self.tool_name,
            description="Read the full instructions of one skill from the catalog, by name.",
        )(read_skill)


_WORD = re.compile(r"[a-z0-9]+")
_FILLER = (
    "the and for with that this from into your you are was were what when how can use not "
    "please about have has its our their them then than any all"
)
_COMMON = frozenset(_FILLER.split())  # words too common to say which skill a task needs


def _words(*texts: str) -> set[str]:
    return {w for t in texts for w in _WORD.findall(t.lower()) if len(w) > 2 and w not in _COMMON}


def _matches(word: str, words: set[str]) -> bool:
    """A task word matches a skill word when one begins the other (refund, refunds, refunding)."""
    return any(
        w.startswith(word) or word.startswith(w) for w in words if min(len(w), len(word)) > 3
    )
