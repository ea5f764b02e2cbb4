"""Prompt-prefix hygiene: find content early in a chat prompt that changes per request.

Provider prefix caches (vLLM APC, OpenAI automatic caching) only hit while the start of
the prompt is byte-identical; a timestamp or request id in the system message makes
every later token a miss, at full input price. The detector finds the first such span
in the first `scan_chars` characters; `PrefixHygiene` keeps per-tenant statistics so
operators can tell a tenant what to move to the end of the prompt.

Nothing here keeps prompt text: a span carries its kind, position and a redacted shape.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter, OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

_MONTH = r"(?i:jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?|apr(?:il)?|may|june?|july?|aug(?:ust)?|sep(?:t(?:ember)?)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?)\.?"
_DAY = r"(?:0?[1-9]|[12]\d|3[01])"
_MON = r"(?:0?[1-9]|1[0-2])"
_YEAR = r"(?:19|20)\d\d"
_YMD = r"\d{4}-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])"
_HEX = "[0-9a-fA-F]"

# What each kind is. Order matters where two kinds match at the same offset: the more
# specific kind first.
KIND_PATTERNS: tuple[tuple[str, str], ...] = (
    ("iso_timestamp", rf"{_YMD}[T ](?:[01]\d|2[0-3]):[0-5]\d(?::[0-5]\d(?:[.,]\d+)?)?(?:Z|[+-]\d\d:?\d\d)?"),
    ("uuid", rf"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"),
    ("date", rf"{_YMD}|{_YEAR}/{_MON}/{_DAY}|{_DAY}[/.]{_MON}[/.]{_YEAR}|{_MON}/{_DAY}/{_YEAR}"
             rf"|{_MONTH} {_DAY}(?:st|nd|rd|th)?,? {_YEAR}|{_DAY} {_MONTH},? {_YEAR}"),
    ("time", r"(?:[01]\d|2[0-3]):[0-5]\d:[0-5]\d(?:[.,]\d+)?"),
    # request ids such as req_8f2K..., chatcmpl-...: a known prefix, 8+ characters, a digit
    ("request_id", r"(?i:req|request|trace|span|run|msg|chatcmpl|sess|session|corr|correlation)[-_](?=[A-Za-z0-9_-]*\d)[A-Za-z0-9_-]{8,}"),
    # 16+ hex characters with both a digit and a letter: ids, hashes, nonces
    ("hex_id", rf"(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F]){_HEX}{{16,}}"),
    # Unix time in seconds (or ms) between 2001 and 2033
    ("epoch", r"1\d{9}(?:\d{3}|\.\d+)?"),
)

# Finding the first span fast. A plain search with the patterns above tries every
# alternative at every position of the prompt, and even a pattern that starts with a
# class such as \d is slow. What the engine and bytes.find do
# fast is look for a literal. So the prompt is translated (one byte per character,
# offsets unchanged) into two views where what every span contains becomes a literal
# needle; the full patterns then run only at the few starts each needle implies.

# Folded view: lower case, digits "0", id separators "-_" as "#", date and time
# separators "./:" as "%".
_FOLD_VIEW = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZ123456789-_./:",
    b"abcdefghijklmnopqrstuvwxyz000000000##%%%",
)
# Hex view: every hex digit "h" (and "h" itself something else).
_HEX_VIEW = bytes.maketrans(b"0123456789abcdefABCDEFhH", b"hhhhhhhhhhhhhhhhhhhhhhgg")

# At every 4-digit group that could be a year or the start of a Unix time: rare in
# prose, and a literal prefix the engine finds fast.
_NUMBER_LIKE = rb"""
0000(?:
    (?P<here>(?=[\#%]0|0{6}))   # 2026-11-29, 2026/1/2, ISO timestamps, Unix time: the span starts here
  | (?<=[%\ ]0000)             # 29.11.2026, 1/2/2026, Nov 29, 2026: it starts before this year
)"""
_TIME_NEEDLE = b"00%00%00"  # 10:32:07
_UUID_NEEDLE = b"hhhh-hhhh-hhhh"  # found 4, 9 or 14 characters into a uuid
_HEX_NEEDLE = b"h" * 16
# At the separator after a known prefix, when the token goes on with a digit in it.
_REQUEST_ID_LIKE = rb"""
\#(?=[a-z0\#]{8})(?=[a-z\#]*0)
(?:(?<=req\#|run\#|msg\#)|(?<=span\#|sess\#|corr\#)|(?<=trace\#)|(?<=request\#|session\#)|(?<=chatcmpl\#)|(?<=correlation\#))
"""
_DATE_BACK = 20  # "September 30th, 2026": from the month to the year
_DATE_WORD_CHARS = 10  # "september" and "30th" fit
_PREFIX_BACK = 12  # "correlation_"
_LETTERS = frozenset(b"abcdefghijklmnopqrstuvwxyz")
_WORDISH = _LETTERS | {ord("0")}
_PERCENT, _SPACE = ord("%"), ord(" ")
_MONTH_WORDS = frozenset(
    b"jan january feb february mar march apr april may jun june jul july aug august"
    b" sep sept september oct october nov november dec december".split()
)
_ORDINALS = (b"st", b"nd", b"rd", b"th")


@dataclass(frozen=True, slots=True)
class VolatileSpan:
    kind: str
    offset: int  # characters from the start of the prompt text (messages joined by "\n")
    message_index: int
    length: int
    excerpt: str  # redacted: letters -> x, digits -> 9; punctuation and spaces kept


class VolatilityDetector:
    """Compiled once; `first_volatile` is safe to call from any request."""

    def __init__(self, context_chars: int = 12) -> None:
        alternatives = "|".join(f"(?P<{kind}>{pattern})" for kind, pattern in KIND_PATTERNS)
        # Not inside a longer word or number: "v2026-11-29x" or mid-token hex are not spans.
        # ASCII: the views see non-ASCII characters as "?", so \d and \w must too.
        self._full = re.compile(rf"(?<![\w.])(?:{alternatives})(?![\w])", re.ASCII)
        self._number_like = re.compile(_NUMBER_LIKE, re.VERBOSE)
        self._request_id_like = re.compile(_REQUEST_ID_LIKE, re.VERBOSE)
        self._context_chars = context_chars

    def first_volatile(self, messages: list[Any], scan_chars: int = 4096) -> VolatileSpan | None:
        text, starts = _prompt_text(messages, scan_chars + 64)  # + a little so a span crossing the limit is whole
        found = self.search(text)
        if found is None or found.start() >= scan_chars:
            return None
        start, end = found.span()
        return VolatileSpan(
            kind=found.lastgroup or "unknown",
            offset=start,
            message_index=bisect_right(starts, start) - 1,
            length=end - start,
            excerpt=self._excerpt(text, start, end),
        )

    def search(self, text: str) -> re.Match[str] | None:
        """The first volatile span in `text`: the same answer as `slow_search`."""
        raw = text.encode("ascii", "replace")  # one byte per character: offsets are kept
        folded, hexed = raw.translate(_FOLD_VIEW), raw.translate(_HEX_VIEW)
        # Each source: (hit, the starts it implies) in increasing hit order, and how far
        # before its hit a start can lie, so a source stops once it cannot do better.
        sources: tuple[tuple[Iterator[tuple[int, Sequence[int]]], int], ...] = (
            (self._number_candidates(text, folded), _DATE_BACK),
            (((hit, (hit,)) for hit in _needles(folded, _TIME_NEEDLE)), 0),
            (self._request_id_candidates(folded), _PREFIX_BACK),
            (((hit, (hit,)) for hit in _runs(hexed, _HEX_NEEDLE)), 0),
            (((hit, (hit - 14, hit - 9, hit - 4)) for hit in _needles(hexed, _UUID_NEEDLE)), 14),
        )
        best: re.Match[str] | None = None
        for candidates, reach in sources:
            for hit, starts in candidates:
                if best is not None and hit - reach >= best.start():
                    break
                for start in starts:
                    if start >= 0 and (best is None or start < best.start()):
                        found = self._full.match(text, start)
                        if found is not None:
                            best = found
                            break
        return best

    def _number_candidates(self, text: str, folded: bytes) -> Iterator[tuple[int, Sequence[int]]]:
        for found in self._number_like.finditer(folded):
            year = found.start()
            before = folded[year - 1] if year else 0
            if before == _PERCENT:  # d/m/yyyy: one or two digits each for d and m
                starts: Sequence[int] = (year - 6, year - 5, year - 4)
            elif before == _SPACE:  # "Nov 29, 2026", "29 Nov 2026"; "in 2024" gives none
                starts = _date_starts(text, folded, year - 1)
            else:
                starts = ()
            if found.lastgroup == "here":
                starts = (*starts, year)
            if starts:
                yield year, starts

    def _request_id_candidates(self, folded: bytes) -> Iterator[tuple[int, Sequence[int]]]:
        for found in self._request_id_like.finditer(folded):
            separator = found.start()
            yield separator, (_run_start(folded, separator, _LETTERS, _PREFIX_BACK),)

    def slow_search(self, text: str) -> re.Match[str] | None:
        """The plain search `search` must agree with (the tests compare them)."""
        return self._full.search(text)

    def _excerpt(self, text: str, start: int, end: int) -> str:
        before = text[max(0, start - self._context_chars):start]
        after = text[end:end + self._context_chars]
        return f"{_redact(before)}<{_redact(text[start:end])}>{_redact(after)}".replace("\n", " ")


def _needles(view: bytes, needle: bytes) -> Iterator[int]:
    position = 0
    while (hit := view.find(needle, position)) >= 0:
        yield hit
        position = hit + 1


def _runs(view: bytes, needle: bytes) -> Iterator[int]:
    """Where each run of a repeated byte at least as long as `needle` starts."""
    position = 0
    while (hit := view.find(needle, position)) >= 0:
        yield hit
        position = hit + len(needle)
        while position < len(view) and view[position] == needle[0]:
            position += 1


def _run_start(view: bytes, end: int, allowed: frozenset[int], limit: int) -> int:
    """Where the run of `allowed` bytes that ends just before `end` starts (at most `limit` back)."""
    start = end
    while start > 0 and end - start < limit and view[start - 1] in allowed:
        start -= 1
    return start


def _date_starts(text: str, folded: bytes, space: int) -> Sequence[int]:
    """Before the year of "Nov 29, 2026" or "29 Nov 2026" come a month and a day, in
    either order, and maybe a comma: the span can only start at the first of them."""
    if text[space + 1:space + 3] not in ("19", "20"):
        return ()
    end = space - 1 if space > 0 and text[space - 1] == "," else space
    second, second_end = _date_word(text, folded, end)
    if second == second_end or second < 2 or text[second - 1] != " ":
        return ()
    first, first_end = _date_word(text, folded, second - 1)
    one, two = folded[first:first_end], folded[second:second_end]
    if (one in _MONTH_WORDS and _is_day(two)) or (_is_day(one) and two in _MONTH_WORDS):
        return (first,)
    return ()


def _date_word(text: str, folded: bytes, end: int) -> tuple[int, int]:
    """(start, end) of the letters-or-digits word ending at `end`, less one trailing '.' ("Sept.")."""
    if end > 0 and text[end - 1] == ".":
        end -= 1
    return _run_start(folded, end, _WORDISH, _DATE_WORD_CHARS), end


def _is_day(word: bytes) -> bool:
    return (word[:-2] if word[-2:] in _ORDINALS else word) in (b"0", b"00")


def _prompt_text(messages: list[Any], limit: int) -> tuple[str, list[int]]:
    """The text of the messages joined by "\\n", cut at `limit`, and where each starts."""
    parts: list[str] = []
    starts: list[int] = []
    length = 0
    for message in messages:
        if length >= limit:
            break
        starts.append(length)
        text = _message_text(message)[:limit - length]  # a huge message is not copied whole
        parts.append(text)
        length += len(text) + 1
    return "\n".join(parts)[:limit], starts


def _message_text(message: Any) -> str:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: only text parts reach the prefix as text
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


_REDACT = str.maketrans(
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
    "x" * 52 + "9" * 10,
)


def _redact(text: str) -> str:
    redacted = text.translate(_REDACT)
    if redacted.isascii():
        return redacted
    return "".join("x" if c.isalnum() and not c.isascii() else c for c in redacted)


@dataclass(slots=True)
class _TenantStats:
    scanned: int = 0
    volatile: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    earliest: VolatileSpan | None = None


class PrefixHygiene:
    """Per-tenant counts of volatile prompt prefixes, for at most `max_tenants` tenants
    (the least recently seen is dropped first, so memory stays bounded)."""

    def __init__(self, max_tenants: int = 10_000) -> None:
        self._max_tenants = max_tenants
        self._stats: OrderedDict[str, _TenantStats] = OrderedDict()
        self.dropped_tenants = 0

    def observe(self, tenant: str, span: VolatileSpan | None) -> None:
        stats = self._stats.get(tenant)
        if stats is None:
            stats = self._stats[tenant] = _TenantStats()
            if len(self._stats) > self._max_tenants:
                self._stats.popitem(last=False)
                self.dropped_tenants += 1
        else:
            self._stats.move_to_end(tenant)
        stats.scanned += 1
        if span is None:
            return
        stats.volatile += 1
        stats.by_kind[span.kind] += 1
        if stats.earliest is None or span.offset < stats.earliest.offset:
            stats.earliest = span

    def report(self) -> dict[str, Any]:
        tenants = {}
        for tenant, stats in sorted(self._stats.items()):
            earliest = stats.earliest
            tenants[tenant] = {
                "requests_scanned": stats.scanned,
                "requests_with_volatile_prefix": stats.volatile,
                "volatile_ratio": stats.volatile / stats.scanned if stats.scanned else 0.0,
                "by_kind": dict(stats.by_kind),
                "earliest_offset": earliest.offset if earliest else None,
                "example": None if earliest is None else {
                    "kind": earliest.kind, "offset": earliest.offset, "message_index": earliest.message_index,
                    "length": earliest.length, "excerpt": earliest.excerpt,
                },
            }
        return {"tenants": tenants, "dropped_tenants": self.dropped_tenants}
