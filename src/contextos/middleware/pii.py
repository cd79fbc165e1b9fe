"""PII redaction: detectors for personal data and secrets, and what to do with what they find.

Detectors are offline (regular expressions plus checksums: Luhn for cards, mod-97 for IBANs,
the `ipaddress` parser for IPs); custom ones take a regex or a callable. Each type has a
strategy: `redact` (a typed placeholder), `mask` (keep the last four characters), `hash` (a
stable pseudonym, so the model can still tell two values apart) or `block`.

Structured detectors (secrets, e-mails, IBANs, IPs) run before the generic card rule, and a
Luhn-valid number is a card only where its context does not say otherwise (an ISBN, an EAN, an
IMEI); a bare run of digits is a phone number only where a word says so.

The layer sits second in the stack: everything inside it, compaction included, only ever sees
redacted text. It rewrites the conversation for the model (transient), tool results and the
model's answers before they are recorded (persistent), and anything inner layers persist
(summaries, memory writes).
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

from contextos.context.compiled import GUARD_PII, CompiledContext, ContextItem, Entry, TrustClass
from contextos.errors import ContentBlocked
from contextos.middleware.base import (
    Compacted,
    ContentGuard,
    Middleware,
    ModelCall,
    ModelHandler,
    ModelResult,
    Services,
    Stop,
    ToolCallInput,
    ToolHandler,
)
from contextos.runs import FailureReason
from contextos.tools.contract import EffectKind as Effect
from contextos.tools.contract import ToolResult
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
    if not 12 <= len(digits) <= 19:
        return False
    total = 0
    for i, d in enumerate(reversed(digits)):
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


# Cards, IBANs, phone numbers and IP addresses all hold a digit (the same `\d` their rules use):
# text without one is ruled out by one search instead of a scan per rule.
_DIGIT = re.compile(r"\d")
_CARD_CANDIDATE = re.compile(r"(?<![\w-])\d(?:[ -]?\d){11,18}(?![\w-])")
# Luhn-valid numbers that are not cards, told apart by a word just before them …
_NOT_A_CARD = re.compile(
    r"(?i)\b(?:isbn(?:-1[03])?|issn|ean(?:-13)?|gtin|upc|imei|meid|iccid|sim|serial|s/n|sku"
    r"|tracking|barcode)\b[^\n\d]{0,12}$"
)
# … and cards that look like other numbers (12-digit Maestro, a leading 0), by the word "card".
_CARD_CONTEXT = re.compile(
    r"(?i)\b(?:card|cc|maestro|visa|mastercard|amex|debit|credit)\b[^\n\d]{0,25}$"
)


def _card_ok(candidate: str, context: bool) -> bool:
    separators = set(re.sub(r"\d", "", candidate))
    if len(separators) > 1:  # "1234-5678 9012" mixes separators: not how cards are written
        return False
    digits = re.sub(r"\D", "", candidate)
    # Payment cards start with 1 to 6 (ISO/IEC 7812's industry digit: airlines, banks, trade);
    # 978/979 … is an ISBN-13 or EAN, 89 … a SIM's ICCID. Shorter 12-digit (Maestro) numbers
    # and the rare other first digit count only where the text says it is a card.
    if not context and (len(digits) < 13 or digits[0] not in "123456"):
        return False
    return luhn_ok(digits) and len(set(digits)) > 1


def _card_spans(text: str) -> Iterable[tuple[int, int]]:
    if _DIGIT.search(text) is None:
        return
    for m in _CARD_CANDIDATE.finditer(text):
        before = max(0, m.start() - 40)
        if _NOT_A_CARD.search(text, before, m.start()):
            continue
        if _card_ok(m.group(0), bool(_CARD_CONTEXT.search(text, before, m.start()))):
            yield m.span()


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
    if _DIGIT.search(text) is None:
        return
    for m in _IBAN_CANDIDATE.finditer(text):
        value = m.group(0)
        while True:
            if iban_ok(value):
                yield m.start(), m.start() + len(value)
                break
            if " " not in value:
                break
            value = value.rsplit(" ", 1)[0]


_PHONE_CANDIDATE = re.compile(
    r"(?<![\w+#/.-])(?:(?:\+|00)\d{1,3}[ .-]?)?(?:\(0\)[ .-]?)?(?:\(\d{1,5}\)[ .-]?)?"
    r"\d{1,12}(?:[ .-]\d{1,8}){0,5}(?:[ ]?(?:x|ext\.?)[ ]?\d{1,5})?(?![\w:]|[.-]\d)"
)
_PHONE_CONTEXT = re.compile(
    r"(?i)\b(?:phone|tel|telephone|mobile|cell|call|fax|desk|office|whatsapp|sms|text|reach"
    r"|ring|dial|registered|number|messages?\s+to)\b[^\n\d]{0,12}\n?[^\n\d]{0,5}$"
)
_PHONE_LABEL_AFTER = re.compile(
    r"(?i)[ \t]*[-(,]?[ \t]*(?:office|mobile|cell|fax|home|work|desk)\b"
)
_NOT_A_PHONE = re.compile(
    r"(?i)\b(?:ssn|social\s+security|passport|licen[cs]e|account|order|invoice|tax|postal"
    r"|post\s*code|zip)\b[^\n\d]{0,20}$"
)


def _phone_spans(text: str) -> Iterable[tuple[int, int]]:
    if _DIGIT.search(text) is None:
        return
    for m in _PHONE_CANDIDATE.finditer(text):
        before = max(0, m.start() - 40)
        if _NOT_A_PHONE.search(text, before, m.start()):
            continue
        context = bool(
            _PHONE_CONTEXT.search(text, before, m.start())
            or _PHONE_LABEL_AFTER.match(text, m.end())
        )
        if _phone_ok(m.group(0), context):
            yield m.span()


def _phone_ok(candidate: str, context: bool) -> bool:
    number = re.split(r" ?(?:x|ext)", candidate)[0]
    if re.fullmatch(r"\d+\.\d+", number):  # a decimal number
        return False
    if re.match(r"(19|20)\d\d[-./ ]\d\d[-./ ]\d\d(?!\d)", number):  # a date
        return False
    if re.fullmatch(r"\d{3}-\d{2}-\d{4}", number):  # a US social security number's shape
        return False
    digits = re.sub(r"\D", "", number)
    grouped = number != digits
    if number.startswith("+") or (number.startswith("00") and grouped):
        return 8 <= len(digits) <= 15
    if len(set(digits)) <= 2 or not (grouped or context):  # a bare run of digits needs a word
        return False
    return 9 <= len(digits) <= 12 or (context and 7 <= len(digits) <= 15)


def _ip_finder(text: str) -> Iterable[tuple[int, int]]:
    # An IPv6 candidate holds two colons at least (it may hold no digit: `ab::cd`).
    for m in _IPV6_CANDIDATE.finditer(text) if text.count(":") >= 2 else ():
        value = m.group(0)
        if value.count(":") < 2 or not re.search(r"[0-9a-fA-F]", value):
            continue
        if _ipv6_ok(value):
            yield m.span()
        elif (
            ":" in value and value.rsplit(":", 1)[1].isdigit() and _ipv6_ok(value.rsplit(":", 1)[0])
        ):
            yield m.start(), m.end() - len(value.rsplit(":", 1)[1]) - 1  # unbracketed, with a port
    # After IPv6, which may end in one (::ffff:192.0.2.1).
    for m in _IPV4.finditer(text) if _DIGIT.search(text) else ():
        yield m.span()


def _ipv6_ok(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_IPV4 = re.compile(rf"(?<![\w.]){_OCTET}(?:\.{_OCTET}){{3}}(?!\.?\d)(?![\w])")
_IPV6_CANDIDATE = re.compile(
    r"(?<![\w:.])(?:[0-9A-Fa-f]{0,4}:){2,8}(?:\d{1,3}(?:\.\d{1,3}){3}|[0-9A-Fa-f]{0,5})(?!\.?[\w:])"
)

_SECRET_PATTERNS: list[tuple[str, tuple[str, ...]]] = [
    # Each with the text at least one of which any match holds, as it is cased: text without
    # any is ruled out by a substring search instead of a scan ((), for rules ignoring case).
    (
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----[\s\S]+?-----END (?:[A-Z0-9]+ )*"
        r"PRIVATE KEY(?: BLOCK)?-----",
        ("-----BEGIN ",),
    ),
    (  # AWS access key ids
        r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",
        ("AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA"),
    ),
    (r"\bgh[pousr]_[A-Za-z0-9]{36,}\b", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_")),
    (r"\bgithub_pat_[A-Za-z0-9_]{40,}\b", ("github_pat_",)),
    (r"\bglpat-[A-Za-z0-9_-]{20,}\b", ("glpat-",)),
    (r"\bxox[abposr]-[A-Za-z0-9-]{10,}", ("xox",)),
    (r"\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}\b", ("_live_", "_test_")),
    (r"\bsk-(?:ant-|proj-)?[A-Za-z0-9_-]{20,}", ("sk-",)),
    (r"\bAIza[0-9A-Za-z_-]{35}\b", ("AIza",)),
    (r"\bSG\.[A-Za-z0-9_-]{16,}\.[A-Za-z0-9_-]{16,}\b", ("SG.",)),
    (r"\bnpm_[A-Za-z0-9]{36}\b", ("npm_",)),
    (r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}", ("eyJ",)),  # JWT
    (r"(?i)\bbearer\s+([A-Za-z0-9._~+/-]{16,}=*)", ()),
    (r"(?i)\bauthorization\s*[:=]\s*basic\s+([A-Za-z0-9+/]{12,}={0,2})", ()),
    (
        r"(?i)\b(?:postgres(?:ql)?|mysql|mongodb(?:\+srv)?|redis|amqps?|https?|ftp)://[^:\s/@]+"
        r":([^@\s/]+)@",
        (),
    ),
]
# `name = value`, `name: value`, `"name": "value"`: only the value is secret.
_SECRET_ASSIGNMENT = re.compile(
    r"(?i)\b(?:[\w.-]*[_.-])?(?P<name>pass(?:word|wd|phrase)?|pwd|secret|api[_-]?key|apikey"
    r"|access[_-]?key|private[_-]?key|(?:auth|access|refresh|session|id|api|bearer|csrf)?[_-]?token"
    r"|credentials?|client[_-]?secret)(?:[_.-]\w+)*[\"']?"
    r"(?P<sep>[ \t]*[:=][ \t]*|[ \t]+is[ \t]+)[\"']?"
    r"(?P<value>(?!\[REDACTED)[^\s\"',;]{6,})"
)


def _assignment_ok(m: re.Match[str]) -> bool:
    """A password may be a plain word; a token or key value has a digit or is long; in prose
    (`the password is …`) the value must not read as a word (`… is incorrect`)."""
    name, value = m.group("name").lower(), m.group("value")
    looks_random = any(c.isdigit() for c in value) and any(c.isalpha() for c in value)
    if m.group("sep").strip() == "is":
        return name.startswith("pass") and (looks_random or len(value) >= 16)
    if name.startswith(("pass", "pwd", "secret")):
        return True
    return len(value) >= 8 and (looks_random or len(value) >= 20)


DEFAULT_DETECTORS: tuple[Detector, ...] = (
    Detector(name="secret", finder=lambda text: _secret_spans(text)),
    Detector(name="email", finder=lambda text: _email_spans(text)),
    # Structured, checksummed types before the generic card rule, which would otherwise take
    # the digits of an IBAN or an IP address for a card number.
    Detector(name="iban", finder=lambda text: _iban_spans(text)),
    Detector(name="ip", finder=_ip_finder),
    Detector(name="credit_card", finder=lambda text: _card_spans(text)),
    Detector(name="phone", finder=lambda text: _phone_spans(text)),
)
"""Checked in this order; a later detector skips text an earlier one already claimed."""

_SECRETS = [(re.compile(p), hints) for p, hints in _SECRET_PATTERNS]

_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?\.)+"
    r"[A-Za-z]{2,24}(?![\w-])"
)
# Spelled out to dodge scrapers: `jane at example dot com`, `jane[at]example[dot]org`; the
# last label must be a common top-level domain, so `look at this dot matrix` stays text.
_AT, _DOT = r"\s*[\[({]at[\])}]\s*|\s+at\s+", r"\s*[\[({]dot[\])}]\s*|\s+dot\s+"
_SPELLED_EMAIL = re.compile(
    rf"(?i)(?<![\w.])[a-z0-9][\w.+-]*(?:{_AT})[a-z0-9-]+(?:(?:{_DOT})[a-z0-9-]+)*(?:{_DOT})"
    r"(?:com|org|net|edu|gov|io|co|uk|de|fr|nl|es|it|eu|ch|be|at|se|no|dk|fi|pl|pt|info|biz"
    r"|me|us|ca|au|jp|in|br)\b"
)


def _email_spans(text: str) -> Iterable[tuple[int, int]]:
    for pattern in (_EMAIL, _SPELLED_EMAIL) if "@" in text else (_SPELLED_EMAIL,):
        for m in pattern.finditer(text):
            yield m.span()


# Every name `_SECRET_ASSIGNMENT` accepts holds one of these words (same flags, same folding):
# text without any cannot hold an assignment, and this is many times cheaper to rule out.
_SECRET_NAME_HINT = re.compile(r"(?i)pass|pwd|secret|key|token|credential")


def _secret_spans(text: str) -> Iterable[tuple[int, int]]:
    for pattern, hints in _SECRETS:
        if hints and not any(h in text for h in hints):
            continue
        for m in pattern.finditer(text):
            yield m.span(1) if pattern.groups else m.span()
    if _SECRET_NAME_HINT.search(text) is None:
        return
    for m in _SECRET_ASSIGNMENT.finditer(text):
        if _assignment_ok(m):
            yield m.span("value")


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


_SCANNED = 16
"""Texts whose detections a guard keeps, newest last."""


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
        model_output: bool = True,
    ) -> None:
        """`tool_results`: redact a tool's result before it is recorded. `model_output`: redact
        the model's answer text before it is recorded (its tool-call arguments are kept as the
        tool needs them, and redacted in what the model is shown later)."""
        self.detectors = (*detectors, *extra)
        self.strategy = Strategy(strategy)
        self.strategies = {k: Strategy(v) for k, v in (strategies or {}).items()}
        self.hash_key = hash_key
        self.tool_results = tool_results
        self.model_output = model_output
        self._items: dict[str, tuple[str, Counter[str]]] = {}
        self._scanned: dict[str, tuple[Detection, ...]] = {}

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

    def bind(self, services: Services) -> Middleware:
        bound = super().bind(services)
        assert isinstance(bound, PiiRedaction)
        bound._scanned = {}  # per run: a tool's result is scanned as it arrives, then in history
        return bound

    def scan(self, text: str) -> list[Detection]:
        # Detectors are pure functions of the text, so a text seen lately is not scanned again.
        hit = self._scanned.get(text)
        if hit is None:
            hit = self._scanned[text] = tuple(detect(text, self.detectors))
            if len(self._scanned) > _SCANNED:
                del self._scanned[next(iter(self._scanned))]  # the oldest
        return list(hit)

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
        return self._guard(context, Counter(), remember=False)

    def _guard(
        self, context: CompiledContext, counts: Counter[str], *, remember: bool = True
    ) -> CompiledContext:
        def text(content: str, counts: Counter[str]) -> str:
            new, found = self.apply(content, allow_block=False)
            counts.update(d.type for d in found)
            return new

        def entry(e: Entry, counts: Counter[str]) -> Entry:
            if GUARD_PII in e.guards:
                return e
            m = e.message
            content = text(m.content, counts)
            # The model's tool-call arguments are context too: they may quote what it was told.
            arguments = [text(c.arguments, counts) for c in m.tool_calls]
            if content == m.content and all(
                a == c.arguments for a, c in zip(arguments, m.tool_calls, strict=True)
            ):
                return e.marked(GUARD_PII)
            calls = tuple(
                replace(c, arguments=a) for c, a in zip(m.tool_calls, arguments, strict=True)
            )
            return e.with_message(replace(m, content=content, tool_calls=calls), GUARD_PII)

        def item(i: ContextItem) -> ContextItem:
            if GUARD_PII in i.guards:
                return i
            # Items are rebuilt every call with the same text (instructions, notices): each
            # text is scanned once, and what it held is counted on every call.
            hit = self._items.get(i.content)
            if hit is None:
                found: Counter[str] = Counter()
                hit = self._items[i.content] = (text(i.content, found), found)
            counts.update(hit[1])
            return i.with_content(hit[0], GUARD_PII)

        if len(self._items) > 256:
            self._items.clear()
        context = self.guard_history(context, counts, entry, remember=remember)
        return context.map_items(item)

    def blocked_input(self, context: CompiledContext) -> list[str]:
        """Types with the `block` strategy found in what the user wrote."""
        if Strategy.BLOCK not in (self.strategy, *self.strategies.values()):
            return []
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
        # A result with receipts is redacted inside: its receipts go to the ledger as they are.
        output = result.output if isinstance(result, ToolResult) else result
        text = render_output(output)
        try:
            redacted, found = self.apply(text, allow_block=call.tool.effect is Effect.READ)
        except PiiBlocked as exc:
            raise ContentBlocked(
                f"the output of {call.tool.name} contained {', '.join(exc.types)}, which the "
                "PII policy blocks; it was withheld",
                tool=call.tool.name,
                types=list(exc.types),
            ) from None
        if not found:
            return result
        return replace(result, output=redacted) if isinstance(result, ToolResult) else redacted
