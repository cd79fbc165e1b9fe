"""PII redaction: detectors for personal data and secrets, and what to do with what they find.

Detectors are offline (regular expressions plus checksums: Luhn for cards, mod-97 for IBANs,
the `ipaddress` parser for IPs); custom ones take a regex or a callable. Each type has a
strategy: `redact` (a typed placeholder), `mask` (keep the last four characters), `hash` (a
stable pseudonym, so the model can still tell two values apart) or `block`.

The layer sits second in the stack: everything inside it, compaction included, only ever sees
redacted text. It rewrites the conversation for the model (transient), tool results before
they are recorded (persistent), and anything inner layers persist (summaries, memory writes).
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from contextos.context.compiled import GUARD_PII, CompiledContext, Entry, TrustClass
from contextos.errors import ContentBlocked
from contextos.middleware.base import (
    Compacted,
    ContentGuard,
    ModelCall,
    ModelHandler,
    ModelResult,
    Stop,
    ToolCallInput,
    ToolHandler,
)
from contextos.runs import FailureReason
from contextos.tools.contract import EffectKind as Effect
from contextos.tools.gateway import render_output


class Strategy(StrEnum):
    REDACT = "redact"
    MASK = "mask"
    HASH = "hash"
    BLOCK = "block"


@dataclass(frozen=True, kw_only=True, slots=True)
class Detection:
    """One piece of PII found in a text."""

    type: str
    """Detector name: email, phone, credit_card, iban, ip, secret, or a custom one."""
    start: int
    """Offset of the first character."""
    end: int
    """Offset after the last character."""
    value: str
    """The matched text."""


Finder = Callable[[str], Iterable[tuple[int, int]]]


@dataclass(frozen=True, kw_only=True, slots=True)
class Detector:
    """Finds one type of PII: a regex (group 1 if it has one, else the match) or a callable."""

    name: str
    """The type it finds; placeholders and telemetry use it."""
    pattern: re.Pattern[str] | None = None
    """Candidates; `validate` may reject some."""
    validate: Callable[[str], bool] | None = None
    """Checks a candidate (checksums, ranges)."""
    finder: Finder | None = None
    """A callable returning (start, end) spans, instead of a pattern."""

    def find(self, text: str) -> Iterable[tuple[int, int]]:
        if self.finder is not None:
            yield from self.finder(text)
            return
        assert self.pattern is not None
        for m in self.pattern.finditer(text):
            group = 1 if m.re.groups else 0
            start, end = m.span(group)
            if start < 0:
                continue
            if self.validate is None or self.validate(text[start:end]):
                yield start, end


def custom(name: str, pattern: str | re.Pattern[str] | Finder) -> Detector:
    """A detector from a regex (string or compiled) or a callable returning spans."""
    if callable(pattern) and not isinstance(pattern, re.Pattern):
        return Detector(name=name, finder=pattern)
    return Detector(name=name, pattern=re.compile(pattern) if isinstance(pattern, str) else pattern)


# -- checksums --------------------------------------------------------------------------------


def luhn_ok(number: str) -> bool:
    digits = [int(c) for c in number if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _card_ok(candidate: str) -> bool:
    separators = set(re.sub(r"\d", "", candidate))
    if len(separators) > 1:  # "1234-5678 9012" mixes separators: not how cards are written
        return False
    digits = re.sub(r"\D", "", candidate)
    return luhn_ok(digits) and len(set(digits)) > 1


_IBAN_LENGTHS = {
    "AD": 24, "AE": 23, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BR": 29,
    "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DK": 18, "DO": 28, "EE": 20, "EG": 29,
    "ES": 24, "FI": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27,
    "GT": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30,
    "KZ": 20, "LB": 28, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24, "ME": 22,
    "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24, "PL": 28, "PS": 29,
    "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SE": 24, "SI": 19, "SK": 24, "SM": 27,
    "TN": 24, "TR": 26, "UA": 29, "VG": 24, "XK": 20,
}  # fmt: skip


def iban_ok(candidate: str) -> bool:
    iban = re.sub(r"\s", "", candidate).upper()
    expected = _IBAN_LENGTHS.get(iban[:2])
    if expected is not None and len(iban) != expected:
        return False
    if not 15 <= len(iban) <= 34:
        return False
    rearranged = iban[4:] + iban[:4]
    number = "".join(str(int(c, 36)) for c in rearranged)
    return int(number) % 97 == 1


_IBAN_CANDIDATE = re.compile(r"\b[A-Z]{2}\d{2}(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{1,4}){3,8})\b")


def _iban_spans(text: str) -> Iterable[tuple[int, int]]:
    """IBAN candidates, trimming trailing words (`… 1332 BIC`) until the checksum holds."""
    for m in _IBAN_CANDIDATE.finditer(text):
        value = m.group(0)
        while True:
            if iban_ok(value):
                yield m.start(), m.start() + len(value)
                break
            if " " not in value:
                break
            value = value.rsplit(" ", 1)[0]


def _phone_ok(candidate: str) -> bool:
    if re.fullmatch(r"\d+\.\d+", candidate):  # a decimal number
        return False
    digits = re.sub(r"\D", "", candidate)
    if candidate.startswith(("+", "00")):
        return 8 <= len(digits) <= 15
    if re.fullmatch(r"(19|20)\d\d[-./ ]\d\d[-./ ]\d\d", candidate):  # a date, not a number
        return False
    return 9 <= len(digits) <= 12 and len(set(digits)) > 2


def _ip_finder(text: str) -> Iterable[tuple[int, int]]:
    for m in _IPV4.finditer(text):
        yield m.span()
    for m in _IPV6_CANDIDATE.finditer(text):
        value = m.group(0)
        if value.count(":") < 2 or not re.search(r"[0-9a-fA-F]", value):
            continue
        try:
            ipaddress.IPv6Address(value)
        except ValueError:
            continue
        yield m.span()


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)(?![\w])")
_IPV6_CANDIDATE = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")

_SECRET_PATTERNS = [
    r"-----BEGIN (?:[A-Z]+ )*PRIVATE KEY-----[\s\S]+?-----END (?:[A-Z]+ )*PRIVATE KEY-----",
    r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b",
    r"\bgh[pousr]_[A-Za-z0-9]{36,}\b",
    r"\bgithub_pat_[A-Za-z0-9_]{40,}\b",
    r"\bglpat-[A-Za-z0-9_-]{20,}\b",
    r"\bxox[abposr]-[A-Za-z0-9-]{10,}",
    r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}\b",
    r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}",
    r"\bAIza[0-9A-Za-z_-]{35}\b",
    r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}\b",
    r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
    r"(?i)\bbearer\s+([A-Za-z0-9._~+/-]{16,}=*)",
    # key = value assignments: only the value is secret
    r"(?i)\b[\w.-]*(?:password|passwd|pwd|secret|api[_-]?key|apikey|access[_-]?key|auth[_-]?token"
    r"|access[_-]?token|client[_-]?secret)\w*\b[\"']?\s*[:=]\s*[\"']?([^\s\"',;]{6,})",
    r"(?i)\b(?:postgres(?:ql)?|mysql|mongodb(?:\+srv)?|redis|amqp)://[^:\s/]+:([^@\s/]+)@",
]

DEFAULT_DETECTORS: tuple[Detector, ...] = (
    Detector(name="secret", finder=lambda text: _secret_spans(text)),
    Detector(
        name="email",
        pattern=re.compile(
            r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+"
            r"[A-Za-z]{2,24}(?![\w-])"
        ),
    ),
    Detector(
        name="credit_card",
        pattern=re.compile(r"(?<![\w-])\d(?:[ -]?\d){12,18}(?![\w-])"),
        validate=_card_ok,
    ),
    Detector(name="iban", finder=lambda text: _iban_spans(text)),
    Detector(name="ip", finder=_ip_finder),
    Detector(
        name="phone",
        pattern=re.compile(
            r"(?<![\w+#/.-])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,5}\)[ .-]?)?\d{1,8}(?:[ .-]\d{1,8}){1,5}"
            r"(?![\w-])|(?<![\w+])\+\d{8,15}(?!\w)"
        ),
        validate=_phone_ok,
    ),
)
"""Checked in this order; a later detector skips text an earlier one already claimed."""

_SECRETS = [re.compile(p) for p in _SECRET_PATTERNS]


def _secret_spans(text: str) -> Iterable[tuple[int, int]]:
    for pattern in _SECRETS:
        for m in pattern.finditer(text):
            yield m.span(1) if pattern.groups else m.span()


def detect(text: str, detectors: Sequence[Detector] = DEFAULT_DETECTORS) -> list[Detection]:
    """Every detection in `text`, non-overlapping, in text order."""
    found: list[Detection] = []
    taken: list[tuple[int, int]] = []
    for det in detectors:
        for start, end in det.find(text):
            if start >= end or any(start < e and s < end for s, e in taken):
                continue
            taken.append((start, end))
            found.append(Detection(type=det.name, start=start, end=end, value=text[start:end]))
    return sorted(found, key=lambda d: d.start)


class PiiBlocked(Exception):
    """Internal: text matched a detector whose strategy is `block`."""

    def __init__(self, types: Sequence[str]) -> None:
        super().__init__(", ".join(types))
        self.types = tuple(types)


def mask(value: str, keep: int = 4) -> str:
    """Keep the last `keep` letters and digits (and an e-mail's domain); star the rest."""
    if "@" in value:
        local, _, domain = value.partition("@")
        return f"{local[:1]}***@{domain}"
    total = sum(c.isalnum() for c in value)
    seen = 0
    out = []
    for c in value:
        if c.isalnum():
            seen += 1
            out.append(c if seen > total - keep else "*")
        else:
            out.append(c)
    return "".join(out)


class PiiRedaction(ContentGuard):
    """Finds PII and secrets and redacts, masks, hashes or blocks them."""

    name = "pii"
    platform_slot = 2

    def __init__(
        self,
        *,
        detectors: Sequence[Detector] = DEFAULT_DETECTORS,
        extra: Sequence[Detector] = (),
        strategy: Strategy | str = Strategy.REDACT,
        strategies: Mapping[str, Strategy | str] | None = None,
        hash_key: str = "",
        tool_results: bool = True,
        model_output: bool = False,
    ) -> None:
        self.detectors = (*detectors, *extra)
        self.strategy = Strategy(strategy)
        self.strategies = {k: Strategy(v) for k, v in (strategies or {}).items()}
        self.hash_key = hash_key
        self.tool_results = tool_results
        self.model_output = model_output

    def fingerprint(self) -> dict[str, Any]:
        return {
            "detectors": [d.name for d in self.detectors],
            "strategy": self.strategy.value,
            "strategies": {k: v.value for k, v in sorted(self.strategies.items())},
            "hash_key": hashlib.sha256(self.hash_key.encode()).hexdigest()[:12],
            "tool_results": self.tool_results,
            "model_output": self.model_output,
        }

    # -- text -------------------------------------------------------------------------------

    def strategy_for(self, kind: str) -> Strategy:
        return self.strategies.get(kind, self.strategy)

    def scan(self, text: str) -> list[Detection]:
        return detect(text, self.detectors)

    def apply(self, text: str, *, allow_block: bool = True) -> tuple[str, list[Detection]]:
        """Rewrite `text`; raise PiiBlocked when a `block` type is present and `allow_block`."""
        found = self.scan(text)
        if not found:
            return text, found
        blocked = [d.type for d in found if self.strategy_for(d.type) is Strategy.BLOCK]
        if blocked and allow_block:
            raise PiiBlocked(sorted(set(blocked)))
        out, last = [], 0
        for d in found:
            out.append(text[last : d.start])
            out.append(self.replacement(d))
            last = d.end
        out.append(text[last:])
        return "".join(out), found

    def replacement(self, d: Detection) -> str:
        strategy = self.strategy_for(d.type)
        if strategy is Strategy.MASK:
            return mask(d.value)
        if strategy is Strategy.HASH:
            digest = hashlib.sha256(f"{self.hash_key}:{d.value}".encode()).hexdigest()[:10]
            return f"<{d.type}:{digest}>"
        return f"[REDACTED:{d.type.upper()}]"

    def redact_text(self, text: str) -> str:
        return self.apply(text, allow_block=False)[0]

    # -- context ----------------------------------------------------------------------------

    def guard(self, context: CompiledContext) -> CompiledContext:
        return self._guard(context, Counter())

    def _guard(self, context: CompiledContext, counts: Counter[str]) -> CompiledContext:
        def text(content: str) -> str:
            new, found = self.apply(content, allow_block=False)
            counts.update(d.type for d in found)
            return new

        def entry(e: Entry) -> Entry:
            if GUARD_PII in e.guards:
                return e
            m = e.message
            # The model's tool-call arguments are context too: they may quote what it was told.
            calls = tuple(replace(c, arguments=text(c.arguments)) for c in m.tool_calls)
            message = replace(m, content=text(m.content), tool_calls=calls)
            return replace(e, message=message, guards=e.guards | {GUARD_PII})

        context = context.map_history(entry)
        return context.map_items(
            lambda i: i if GUARD_PII in i.guards else i.with_content(text(i.content), GUARD_PII)
        )

    def blocked_input(self, context: CompiledContext) -> list[str]:
        """Types with the `block` strategy found in what the user wrote."""
        kinds: set[str] = set()
        for e in context.history:
            if e.trust is TrustClass.USER and GUARD_PII not in e.guards:
                kinds.update(
                    d.type
                    for d in self.scan(e.message.content)
                    if self.strategy_for(d.type) is Strategy.BLOCK
                )
        return sorted(kinds)

    # -- hooks ------------------------------------------------------------------------------

    async def wrap_model_call(self, call: ModelCall, call_next: ModelHandler) -> ModelResult:
        blocked = self.blocked_input(call.context)
        if blocked:
            return ModelResult(
                call=call,
                stop=Stop(
                    reason=FailureReason.CONTENT_BLOCKED,
                    message="the input contains data the PII policy blocks: " + ", ".join(blocked),
                    layer=self.name,
                ),
            ).with_telemetry(**{f"pii.blocked.{k}": 1 for k in blocked})
        counts: Counter[str] = Counter()
        result = await call_next(call.with_context(self._guard(call.context, counts)))
        records = tuple(
            replace(r, summary=self.redact_text(r.summary)) if isinstance(r, Compacted) else r
            for r in result.records
        )
        result = replace(result, records=records)
        if self.model_output and result.response is not None:
            message = result.response.message
            new = self.redact_text(message.content)
            if new != message.content:
                response = replace(result.response, message=replace(message, content=new))
                result = replace(result, response=response)
        return result.with_telemetry(**{f"pii.{k}": n for k, n in counts.items()})

    async def wrap_tool_call(self, call: ToolCallInput, call_next: ToolHandler) -> Any:
        """Redact the tool's result before it is recorded; `block` fails a read's attempt.

        A tool with effects already acted when its result arrives, so its result is redacted
        rather than blocked: failing it would make the effect look undone.
        """
        result = await call_next(call)
        if not self.tool_results:
            return result
        text = render_output(result)
        try:
            redacted, found = self.apply(text, allow_block=call.tool.effect is Effect.READ)
        except PiiBlocked as exc:
            raise ContentBlocked(
                f"the output of {call.tool.name} contained {', '.join(exc.types)}, which the "
                "PII policy blocks; it was withheld",
                tool=call.tool.name,
                types=list(exc.types),
            ) from None
        return redacted if found else result
