"""Finding jobs among 100,000 while a person types: an index of the names built once per jobs
revision, and facets (tag, owner, state) built when first asked for and kept until the job
set or the members change, or a while passes (states move with time).

Names are matched without regard to case: a prefix match is a range of the sorted lower-case
names (two bisections); a substring match is a search of one string holding every name, one
per line, which runs in C. Prefix matches come first, then the other names holding the text,
each group by name.

A set of names (a facet value, a match) is a bitmask over the names' positions, a Python int:
combining a search with filters is a few ``&`` of 100,000-bit integers and a count of bits,
all in C, whatever the number of jobs that match.
"""

from __future__ import annotations

import asyncio
import bisect
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

# Jobs a facet build walks before it lets the event loop run ticks again.
SLICE = 2_000
# How long facets are trusted while neither jobs nor members change: a job's state moves
# with time (a window opens, a one-time job passes).
FACET_TTL_S = 300.0


@dataclass
class Names:
    """Every job name of one jobs revision, sorted by lower-case name."""

    revision: int
    names: list[str]
    lower: list[str]
    text: str  # "\n" + every lower-case name followed by "\n"
    starts: list[int]  # where each name starts in ``text``

    @classmethod
    def build(cls, revision: int, names: list[str]) -> Names:
        ordered = sorted(names, key=lambda n: (n.lower(), n))
        lower = [n.lower() for n in ordered]
        starts = []
        at = 1
        for name in lower:
            starts.append(at)
            at += len(name) + 1
        return cls(revision, ordered, lower, "\n" + "\n".join(lower) + "\n", starts)

    def prefix_range(self, query: str) -> tuple[int, int]:
        low = bisect.bisect_left(self.lower, query)
        high = bisect.bisect_left(self.lower, query + "\U0010ffff", low)
        return low, high

    def inner(self, query: str) -> Iterator[int]:
        """Positions of the names holding ``query`` that do not start with it, in order."""
        for found in _inner(query).finditer(self.text):
            yield bisect.bisect_right(self.starts, found.start() + 1) - 1

    def matches(self, query: str) -> Iterator[int]:
        """Positions (in ``names``) of the names holding ``query``: prefix matches first."""
        q = query.lower()
        if not q:
            yield from range(len(self.names))
            return
        yield from range(*self.prefix_range(q))
        yield from self.inner(q)

    def count(self, query: str) -> int:
        q = query.lower()
        if not q:
            return len(self.names)
        low, high = self.prefix_range(q)
        return high - low + len(_inner(q).findall(self.text))

    def masks(self, query: str) -> tuple[int, int]:
        """The matches of ``query`` as two bitmasks: prefix matches, then the others."""
        q = query.lower()
        if not q:
            return (1 << len(self.names)) - 1, 0
        low, high = self.prefix_range(q)
        return ((1 << (high - low)) - 1) << low, to_mask(self.inner(q), len(self.names))

    def position(self, name: str) -> int | None:
        at = bisect.bisect_left(self.lower, name.lower())
        while at < len(self.names) and self.lower[at] == name.lower():
            if self.names[at] == name:
                return at
            at += 1
        return None


def _inner(q: str) -> re.Pattern[str]:
    quoted = re.escape(q)
    return re.compile(r"\n(?!" + quoted + r")[^\n]+?" + quoted)


def to_mask(positions: Iterable[int], size: int) -> int:
    bits = bytearray((size + 7) // 8)
    for p in positions:
        bits[p >> 3] |= 1 << (p & 7)
    return int.from_bytes(bits, "little")


def every_bit(mask: int) -> list[int]:
    """Positions of every set bit of ``mask``, in order (a byte at a time: no shifts of the
    whole integer per bit)."""
    found: list[int] = []
    for at, byte in enumerate(mask.to_bytes((mask.bit_length() + 7) // 8, "little")):
        if byte:
            base = at * 8
            found.extend(base + bit for bit in range(8) if byte >> bit & 1)
    return found


def set_bits(mask: int, skip: int, take: int) -> list[int]:
    """Positions of the set bits of ``mask`` in order, past the first ``skip``, at most
    ``take`` of them."""
    if skip:
        # The position after which ``skip`` bits are set: bisect on counts of low bits.
        low, high = 0, mask.bit_length()
        while low < high:
            mid = (low + high) // 2
            if (mask & ((1 << mid) - 1)).bit_count() < skip:
                low = mid + 1
            else:
                high = mid
        mask >>= low
        offset = low
    else:
        offset = 0
    found: list[int] = []
    while mask and len(found) < take:
        lowest = mask & -mask
        at = lowest.bit_length() - 1
        found.append(offset + at)
        mask >>= at + 1
        offset += at + 1
    return found


@dataclass
class Facets:
    """Bitmasks over the positions of one ``Names`` per facet value."""

    key: tuple[object, ...]
    built_at: float
    by_tag: dict[str, int] = field(default_factory=dict)
    by_owner: dict[str, int] = field(default_factory=dict)
    by_state: dict[str, int] = field(default_factory=dict)


class JobIndex:
    """The names index and the facets; each rebuilds only when what it reflects changed."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._names: Names | None = None
        self._facets: Facets | None = None
        self._building: asyncio.Lock = asyncio.Lock()
        self.builds = 0  # index builds so far: the tests check it is once per revision

    def names(self, revision: int, all_names: Callable[[], list[str]]) -> Names:
        if self._names is None or self._names.revision != revision:
            self._names = Names.build(revision, all_names())
            self.builds += 1
        return self._names

    async def facets(
        self,
        names: Names,
        key: tuple[object, ...],
        row: Callable[[str], tuple[list[str], str, list[str]]],
    ) -> Facets:
        """``row(name)`` says a job's (tags, owner, states); every name is walked, in
        slices, when the facets are older than ``names``, ``key`` or FACET_TTL_S."""
        key = (names.revision, *key)
        async with self._building:
            now = self._monotonic()
            known = self._facets
            if known is not None and known.key == key and now - known.built_at < FACET_TTL_S:
                return known
            size = len(names.names)
            groups: dict[tuple[str, str], bytearray] = {}

            def mark(kind: str, value: str, at: int) -> None:
                bits = groups.get((kind, value))
                if bits is None:
                    bits = groups[(kind, value)] = bytearray((size + 7) // 8)
                bits[at >> 3] |= 1 << (at & 7)

            for at, name in enumerate(names.names):
                tags, owner, states = row(name)
                for tag in tags:
                    mark("tag", tag, at)
                mark("owner", owner, at)
                for state in states:
                    mark("state", state, at)
                if at % SLICE == SLICE - 1:
                    await asyncio.sleep(0)
            facets = Facets(key, now)
            chosen = {"tag": facets.by_tag, "owner": facets.by_owner, "state": facets.by_state}
            for (kind, value), bits in groups.items():
                chosen[kind][value] = int.from_bytes(bits, "little")
            self._facets = facets
            return facets
