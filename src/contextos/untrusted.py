"""Untrusted text made safe to show a model: normalised, defanged, flagged and spotlighted.

Text the agent's author did not write (a tool's output, a retrieved passage, a remote server's
tool description) is spotlighted: wrapped in delimiters that name where it came from, with an
id derived from the source, the event and the content. Not from the run: the same conversation
must reach the model as the same prompt in every run, or a model that answers a given prompt
deterministically (the embedded one, greedy) would answer differently from run to run.

Before marking, the text is normalised (NFKC, invisible and bidirectional controls removed,
every line break a `\\n`, every other space a space), so a marker split by a zero-width space
or written in full-width look-alikes is seen for what it is. Then anything that could pass for
our delimiters, or for a turn or role marker of a chat template (`CHAT_TEMPLATE_MARKERS`), is
defanged: its brackets become look-alikes and a role line is quoted, so a block can neither
close itself early nor open a fake turn (which is what keeps a block closed: its id, a hash of
its own text, only names it). Phrases of known prompt-injection patterns are flagged in place;
optional datamarking interleaves a marker between words.

Only text functions live here, with no runtime types: the sanitizer layer
(`contextos.middleware.sanitize`) applies them to a model call's context, and MCP to a server's
descriptions.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Any

from contextos import prefilter

# Look-alike characters replace the ones that could close a block or open a turn.
LT, GT = "\u2039", "\u203a"  # single angle quotation marks
LB, RB = "\u27e6", "\u27e7"  # white square brackets
MARK = "\u02c6"  # modifier circumflex, the default datamark

OPEN = "<<untrusted-data"
CLOSE = "<<end untrusted-data"

# -- normalisation ----------------------------------------------------------------------------

# Characters that render as nothing (zero-width spaces and joiners, soft hyphen, word joiner,
# BOM, Hangul fillers, variation selectors, the tag characters that smuggle hidden ASCII) and
# the bidirectional controls that reorder what a reader sees.
_INVISIBLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\U000e0000-\U000e007f\U000e0100-\U000e01ef]"
)
# Every line break a tokenizer or a reader may take as one: CR LF, a bare CR, vertical tab, form
# feed, the file, group and record separators, NEL, the line and paragraph separators.
_LINE_BREAK = re.compile("\r\n|[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_OTHER_SPACE = re.compile(r"[^\S\n\t]")  # no-break, ogham, ideographic, … spaces


def normalise(text: str) -> tuple[str, int]:
    """Text as a tokenizer would read it, and how many invisible characters were removed.

    NFKC folds full-width and compatibility forms (DeepSeek's full-width `<|User|>` becomes the
    ASCII one); invisible and bidirectional controls go first, so that NFKC sees the letters
    they kept apart; line breaks become `\\n` and other spaces a plain space, so a role line
    cannot hide behind a bare carriage return or a no-break space.
    """
    stripped, hidden = _INVISIBLE.subn("", text)
    text = unicodedata.normalize("NFKC", stripped)
    text = _LINE_BREAK.sub("\n", text)
    return _OTHER_SPACE.sub(" ", text), hidden


# -- chat-template markers --------------------------------------------------------------------

CHAT_TEMPLATE_MARKERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ChatML (OpenAI, Qwen, Yi, Phi-4)", ("<|im_start|>", "<|im_end|>", "<|im_sep|>")),
    ("Qwen tools and reasoning", ("<tool_call>", "</tool_response>", "<think>", "</think>")),
    ("Llama 2", ("[INST]", "[/INST]", "<<SYS>>", "<</SYS>>", "<s>", "</s>")),
    (
        "Llama 3",
        ("<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"),
    ),
    ("Gemma", ("<start_of_turn>", "<end_of_turn>", "<bos>", "<eos>")),
    (
        "Mistral",
        (
            "[SYSTEM_PROMPT]",
            "[/SYSTEM_PROMPT]",
            "[AVAILABLE_TOOLS]",
            "[TOOL_CALLS]",
            "[TOOL_RESULTS]",
            "[/TOOL_RESULTS]",
        ),
    ),
    ("Phi-3, Zephyr", ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>", "<|endoftext|>")),
    (
        "DeepSeek",
        (
            "<\uff5cbegin\u2581of\u2581sentence\uff5c>",
            "<\uff5cUser\uff5c>",
            "<\uff5cAssistant\uff5c>",
            "<\uff5cend\u2581of\u2581sentence\uff5c>",
            "<\uff5ctool\u2581calls\u2581begin\uff5c>",
        ),
    ),
    ("Command R", ("<|START_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|END_OF_TURN_TOKEN|>")),
    ("Granite", ("<|start_of_role|>", "<|end_of_role|>", "<|end_of_text|>")),
    ("gpt-oss (harmony)", ("<|start|>", "<|channel|>", "<|message|>", "<|return|>")),
    ("Anthropic text prompts", ("Human:", "Assistant:")),
    ("Alpaca, Vicuna", ("### Instruction:", "### Response:", "USER:", "ASSISTANT:")),
    (
        "generic role markers",
        ("[system]", "[/system]", "<system>", "</system>", "System:", "System note:"),
    ),
)
"""Turn and role markers of the chat templates of major model families, as each writes them.
`defang` neutralises every one, and the family of markers each stands for, not only these
spellings; the tests spoof each of them and docs/context.md lists them."""

_ROLES = r"system|assistant|user|human|developer|admin|tool|instructions?"
# (kind, pattern), tried in this order; a marker one pattern defanged no other can match.
_MARKERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # ChatML, Llama 3, Phi, DeepSeek (after NFKC), Command R, Granite, harmony: <|…|>
    ("chat_template", re.compile(r"<\|[^|<>\n]{0,60}\|>|<</?SYS>>", re.IGNORECASE)),
    # Llama 2 and Mistral [TAGS], Gemma and Qwen <tags>, end-of-sequence tokens
    (
        "chat_template",
        re.compile(
            r"\[\s*/?\s*(?:INST|SYS|SYSTEM_PROMPT|AVAILABLE_TOOLS|TOOL_CALLS|TOOL_RESULTS"
            r"|TOOL_CONTENT|THINK)\s*\]|</?s>|<\s*/?\s*(?:bos|eos|think|tool_call|tool_response"
            r"|(?:start|end|begin)[ _]of[ _](?:turn|text|session|sentence|conversation|role"
            r"|document|input|context))\s*>",
            re.IGNORECASE,
        ),
    ),
    ("delimiter", re.compile(r"<<|>>")),  # our own
    ("role_tag", re.compile(rf"\[\s*/?\s*(?:{_ROLES})\b[^\[\]\n]{{0,40}}\]", re.IGNORECASE)),
    (
        "role_tag",
        re.compile(
            rf"<\s*/?\s*(?:{_ROLES}|information|important|prompt|context|data|untrusted[\w-]*"
            r"|tool_?(?:output|result|call)s?|function_?(?:results?|calls?))\b[^<>\n]{0,80}>",
            re.IGNORECASE,
        ),
    ),
)
# A line that opens a turn: `System:`, `### System message:`, `> Human:`, `**Assistant:**` …
_ROLE_LINE = re.compile(
    r"(?im)^([ \t>]*)((?:#{1,6}|\*\*)[ \t]*)?(system|assistant|developer|user|human)"
    r"([ \t]*(?:message|prompt|note|notice|instructions?|override|update|request)?[ \t]*\**:)"
)
# … or a section of an instruction-tuning template: `### Instruction:`, `### Response:`.
_SECTION_LINE = re.compile(r"(?im)^([ \t>]*)(#{1,6}[ \t]*)(instructions?|response|input)([ \t]*:)")
# Markers that also raise a flag: data has no business opening these.
_FLAGGED_ROLE = re.compile(
    r"system|assistant|developer|human|admin|instruction|important|information|response",
    re.IGNORECASE,
)
_OWN_DELIMITER = re.compile(r"\s*(?:end\s+)?untrusted[\s_-]*data", re.IGNORECASE)

# -- injection patterns -----------------------------------------------------------------------

_AI = (
    r"(?:ai|a\.i\.|llms?|(?:large\s+)?language\s+models?|chat\s?bots?|chatgpt|gpt[\w.-]*|claude"
    r"|gemini|ai\s+(?:assistants?|agents?|models?|systems?)|automated\s+[\w-]+(?:\s+[\w-]+)?)"
)

INJECTION_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(p, re.IGNORECASE))
    for name, p in [
        (
            # an order to drop what the reader was told or shown
            "ignore_previous",
            r"\b(?:ignore|disregard|forget|bypass)\b[^.\n]{0,40}?\b(?:\w{0,3}nstruct\w*"
            r"|directions?|directives?|prompts?|rules|guidelines|tasks?|context|guidance"
            r"|commands|orders|data|info|information|text|content|documents?|indicators"
            r"|everything|all\s+(?:else|other))\b",
        ),
        (
            "new_instructions",
            r"\b(?:new|updated|real|actual|true|important|additional|hidden|secret|revised"
            r"|core|critical|urgent|priority)\s+(?:instructions?|directives?|orders?|task)\s*[:!]",
        ),
        (
            "role_override",
            r"\byou\s+are\s+now\b|\bfrom\s+now\s+on\b[^.\n]{0,40}\byou\b|\bpretend\s+(?:to\s+be"
            r"|you\s+are)\b|\byour\s+new\s+(?:role|task|goal|persona|instructions?)\b",
        ),
        ("system_tag", r"#{2,}\s*\(?\s*system[\s_]*message\s*\)?"),
        ("important_message", r"\bthis\s+is\s+an?\s+important\s+message\s+from\b"),
        (
            "before_task",
            r"\bbefore\s+you\s+(?:can\s+)?(?:solve|do|complete|continue)\b[^.\n]{0,40}"
            r"\btask\b",
        ),
        ("urgent_prefix", r"\b(?:IMPORTANT|ATTENTION|URGENT)\s*!{2,}"),
        (
            "secrecy",
            r"\b(?:do\s+not|don't|never)\s+(?:tell|inform|mention|reveal|disclose)\b[^.\n]{0,20}"
            r"\bthe\s+user\b|\bwithout\s+(?:telling|informing|asking)\s+the\s+user\b",
        ),
        (
            "exfiltrate",
            r"\b(?:send|forward|email|transfer|post)\b[^.\n]{0,60}\b(?:password|"
            r"credentials?|api[ _-]?keys?|secrets?|tokens?)\b",
        ),
        ("todo_directive", r"(?m)^\s*TODO\s*:"),
        (
            # text that speaks to the model reading it rather than to a person
            "addressed_to_model",
            rf"\b(?:note|message|instructions?|reminder|notice|directive|attention)\s+(?:to|for)"
            rf"\s+(?:the\s+|any\s+|all\s+)?{_AI}\b|\b(?:dear|hey|hi|hello)\s+{_AI}\b"
            rf"|\bfor\s+{_AI}\b[^.\n]{{0,40}}(?:\bsystems?|\bsoftware|\btools?|\bscan\w*):"
            rf"|\b(?:visible|readable)\s+(?:only\s+)?to\s+(?:the\s+)?{_AI}\b"
            r"|\binvisible\s+to\s+humans\b",
        ),
        (
            # dictating the answer: reply with only …, just print …, if the user asks …
            "dictated_answer",
            r"\b(?:reply|respond|answer)\s+(?:only\s+)?with\s+(?:only|just|exactly|nothing\s+but"
            r"|the\s+following)\b|\b(?:simply|just|only)\s+(?:respond|reply|say|print|output)\b"
            r"|\b(?:print|output|repeat)\s+(?:exactly\s+|only\s+|out\s+)?[\"'\u201c\u2018<]"
            r"|\b(?:print|say|output|repeat)\s+(?:the\s+following|after\s+me|this\s+(?:sentence"
            r"|text|phrase))\b|\bif\s+(?:the\s+)?user\s+asks?\b|\bif\s+(?:you\s+are\s+)?"
            r"(?:questioned|asked)\b[^.\n]{0,30}\b(?:report|say|reply|respond|answer|tell)\b",
        ),
        (
            # an upper-case role label inside a line (`Registrant: SYSTEM: …`); case matters
            "role_label",
            r"(?-i:(?<!\(quoted\) )\b(?:SYSTEM|ASSISTANT|DEVELOPER|ADMIN)(?:\s+(?:MESSAGE|PROMPT"
            r"|NOTE|OVERRIDE|REQUEST|INSTRUCTIONS?))?\s*:)",
        ),
        (
            # a banner announcing instructions: `-- CORE INSTRUCTION`, `== SYSTEM OVERRIDE ==`
            "instruction_banner",
            r"(?m)(?-i:^[ \t]*(?:-{2,}|={2,}|\*{2,}|#{2,})[ \t]*[A-Z][A-Z ,]*\b(?:INSTRUCTIONS?"
            r"|DIRECTIVES?|OVERRIDE|COMMANDS?)\b)",
        ),
    ]
)
"""Named patterns of known prompt-injection phrasing, grouped by what the phrase does rather
than by how one corpus words it; docs/context.md reports how often they fire on two public
corpora of injections and on benign text."""

_INJECTION_PREFILTER = prefilter.Prefilter(pattern for _, pattern in INJECTION_PATTERNS)
"""Most text holds none of the words most of the patterns need, and is not searched for them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Spotlit:
    """A block after sanitizing, with what was done to it."""

    text: str
    """The delimited, defanged block."""
    id: str
    """The block's id (also in its closing delimiter)."""
    spoofs: int
    """Delimiter, chat-template and role markers defanged."""
    flags: tuple[str, ...]
    """Names of the known injection patterns and flagged markers found."""
    hidden: int = 0
    """Invisible or bidirectional control characters removed."""


def _neutralise(text: str) -> tuple[str, Counter[str]]:
    """Defang markers in normalised text; count them by kind (`flag:<kind>` for flagged ones)."""
    found: Counter[str] = Counter()

    def brackets(kind: str) -> Any:
        def sub(m: re.Match[str]) -> str:
            found[kind] += 1
            if kind == "chat_template" or _FLAGGED_ROLE.search(m.group(0)):
                found[f"flag:{kind}"] += 1
            if kind == "delimiter" and _OWN_DELIMITER.match(m.string, m.end()):
                found["flag:fake_delimiter"] += 1
            return m.group(0).translate(_LOOKALIKE)

        return sub

    for kind, pattern in _MARKERS:
        text = pattern.sub(brackets(kind), text)

    def role(m: re.Match[str]) -> str:
        found["role_line"] += 1
        if _FLAGGED_ROLE.search(m.group(3)) or m.re is _SECTION_LINE:
            found["flag:role_line"] += 1
        return f"{m.group(1)}(quoted) {m.group(2) or ''}{m.group(3)}{m.group(4)}"

    text = _ROLE_LINE.sub(role, text)
    return _SECTION_LINE.sub(role, text), found


_LOOKALIKE = str.maketrans({"<": LT, ">": GT, "[": LB, "]": RB})


def defang(text: str) -> tuple[str, int]:
    """Normalise, then neutralise delimiter, template and role markers; return how many."""
    text, found = _neutralise(normalise(text)[0])
    return text, sum(n for kind, n in found.items() if not kind.startswith("flag:"))


def flag_injections(text: str) -> tuple[str, tuple[str, ...]]:
    """Mark phrases of known injection patterns in place, as `[injection? ...]` in look-alikes."""
    found: list[str] = []
    spans: list[tuple[int, int, str]] = []
    may_match = _INJECTION_PREFILTER.may_match(text)
    for (name, pattern), may in zip(INJECTION_PATTERNS, may_match, strict=True):
        if not may:  # the text holds none of the words every match of it holds
            continue
        for m in pattern.finditer(text):
            if any(m.start() < e and s < m.end() for s, e, _ in spans):
                continue
            spans.append((m.start(), m.end(), name))
            found.append(name)
    if not spans:
        return text, ()
    out, last = [], 0
    for s, e, _ in sorted(spans):
        out.append(text[last:s])
        out.append(f"{LB}injection? {text[s:e]}{RB}")
        last = e
    out.append(text[last:])
    return "".join(out), tuple(sorted(set(found)))


def datamark(text: str, marker: str = MARK) -> str:
    """Interleave `marker` between words (line breaks kept)."""
    return "\n".join(marker.join(line.split()) for line in text.split("\n"))


def block_id(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:10]


def spotlight(
    text: str,
    *,
    source: str,
    ref: str = "",
    salt: str = "",
    datamark_with: str | None = None,
    flag: bool = True,
) -> Spotlit:
    """Wrap untrusted text in provenance-labelled delimiters, normalised and defanged inside."""
    ident = block_id(salt, source, ref, text)
    body, hidden = normalise(text)
    body, found = _neutralise(body)
    spoofs = sum(n for kind, n in found.items() if not kind.startswith("flag:"))
    flags: tuple[str, ...] = ()
    if flag:
        body, flags = flag_injections(body)
        marked = {kind.removeprefix("flag:") for kind in found if kind.startswith("flag:")}
        flags = tuple(sorted({*flags, *marked}))
    if datamark_with:
        body = datamark(body, datamark_with)
    attrs = f'source="{_attr(source)}"' + (f' ref="{_attr(ref)}"' if ref else "")
    if flags:
        attrs += f' flagged="{",".join(flags)}"'
    return Spotlit(
        text=f'{OPEN} {attrs} id="{ident}">>\n{body}\n{CLOSE} id="{ident}">>',
        id=ident,
        spoofs=spoofs,
        flags=flags,
        hidden=hidden,
    )


def _attr(value: str) -> str:
    return re.sub(r"[^\w:./@#+-]", "_", normalise(value)[0])[:120]
