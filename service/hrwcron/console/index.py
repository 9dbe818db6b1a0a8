"""Finding jobs among 100,000 while a person types: an index of the names built once per jobs
revision, and facets (tag, owner, state) built when first asked for and kept until the job
set or the members change, or a while passes (states move with time).

Both are built in slices (``Pace``): at most SLICE items or TURN_S of work (or one merge of
sorted names in C), then the event loop runs ticks again, so no build holds it for long (at
100,000 jobs the names take about 100 ms and the facets a few hundred, in turns of a few
milliseconds). A revision that changed jobs but not their names (a pause, an edit) keeps the
sorted names and only checks them.

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
from dataclasses import dataclass, field, replace

from hrwcron.console.slices import SLICE, Pace, Work

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
    members: set[str] = field(default_factory=set, repr=False)  # ``names`` as a set

    @classmethod
    def build(cls, revision: int, names: list[str]) -> Names:
        """At once, in one turn (for a few names; a replica's index uses ``sliced``)."""
        ordered = sorted(names, key=lambda n: (n.lower(), n))
        lower = [n.lower() for n in ordered]
        starts = []
        at = 1
        for name in lower:
            starts.append(at)
            at += len(name) + 1
        text = "\n" + "\n".join(lower) + "\n"
        return cls(revision, ordered, lower, text, starts, set(ordered))

    @classmethod
    async def sliced(cls, revision: int, names: list[str], pace: Pace) -> Names:
        """What ``build`` makes, in turns of at most SLICE names or one merge in C.

        Runs of SLICE names are sorted, then merged two at a time (``sorted`` of two sorted
        runs is one linear merge in C: the last, of every name, takes a few milliseconds at
        100,000). A name sorts as "lower-case name, NUL, name", the order of ``build``'s key
        (names are KV keys, which hold no NUL).
        """
        runs = []
        for at in range(0, len(names), SLICE):
            runs.append(sorted([f"{n.lower()}\0{n}" for n in names[at : at + SLICE]]))
            await pace.step(SLICE)
        while len(runs) > 1:
            merged = []
            for at in range(0, len(runs) - 1, 2):
                merged.append(sorted(runs[at] + runs[at + 1]))
                pace.work.merges += 1
                await pace.pause()  # a merge is a turn of its own
            if len(runs) % 2:
                merged.append(runs[-1])
            runs = merged
        keys = runs[0] if runs else []
        ordered: list[str] = []
        lower: list[str] = []
        starts: list[int] = []
        where = 1
        for at in range(0, len(keys), SLICE):
            for key in keys[at : at + SLICE]:
                low, _, name = key.partition("\0")
                lower.append(low)
                ordered.append(name)
                starts.append(where)
                where += len(low) + 1
            await pace.step(SLICE)
        members = set()
        for at in range(0, len(ordered), SLICE):
            members.update(ordered[at : at + SLICE])
            await pace.step(SLICE)
        text = "\n" + "\n".join(lower) + "\n"  # one join in C: 4 ms at 100,000 names
        return cls(revision, ordered, lower, text, starts, members)

    async def same_names(self, names: list[str], pace: Pace) -> bool:
        """Whether ``names`` (without repeats) are exactly these, checked a slice at a time."""
        if len(names) != len(self.names):
            return False
        for at in range(0, len(names), SLICE):
            if not self.members.issuperset(names[at : at + SLICE]):
                return False
            await pace.step(SLICE)
        return True

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
    names: list[str] = field(default_factory=list, repr=False)  # the names' list they are over
    versions: list[int] = field(default_factory=list, repr=False)  # each job's, by position

    def of(self, kind: str) -> dict[str, int]:
        return {"tag": self.by_tag, "owner": self.by_owner, "state": self.by_state}[kind]


Row = Callable[[str], tuple[list[str], str, list[str]]]
"""A job's tags, owner and states, by name."""
Version = Callable[[str], int]
"""Which spec of a job the replica has loaded (its KV revision), by name."""


class JobIndex:
    """The names index and the facets; each rebuilds only when what it reflects changed."""

    def __init__(self, monotonic: Callable[[], float]) -> None:
        self._monotonic = monotonic
        self._names: Names | None = None
        self._facets: Facets | None = None
        self._building: asyncio.Lock = asyncio.Lock()
        self._naming: asyncio.Lock = asyncio.Lock()
        self.work = Work()
        # build kind -> (its longest turn, the whole build) in seconds, the latest of each
        self.timings: dict[str, tuple[float, float]] = {}
        self.builds = 0  # index builds so far: the tests check it is once per revision
        self.facet_builds = 0  # facets built walking every job
        self.facet_updates = 0  # facets updated walking only the jobs that changed

    async def names(self, revision: int, all_names: Callable[[], list[str]]) -> Names:
        """The index for ``revision``: built in slices when the names changed, the one before
        (checked in slices) when only the jobs did."""
        known = self._names
        if known is not None and known.revision == revision:
            return known
        async with self._naming:  # one build at a time; the others wait for it
            known = self._names
            if known is not None and known.revision == revision:
                return known
            pace = Pace(self.work)
            fresh = all_names()
            if known is not None and await known.same_names(fresh, pace):
                self._names = replace(known, revision=revision)
                self.timings["names checked"] = pace.finish()
            else:
                self._names = await Names.sliced(revision, fresh, pace)
                self.builds += 1
                self.timings["names"] = pace.finish()
            return self._names

    async def facets(
        self, names: Names, key: tuple[object, ...], row: Row, version: Version
    ) -> Facets:
        """``row(name)`` says a job's (tags, owner, states), ``version(name)`` which spec of
        it that is (its KV revision). When the facets are older than FACET_TTL_S or ``key``
        (what else they reflect: the live members), every name is walked, in slices; when
        only jobs changed, and not the names, only the jobs whose version changed are."""
        key = (names.revision, *key)
        async with self._building:
            now = self._monotonic()
            known = self._facets
            if known is not None and now - known.built_at < FACET_TTL_S:
                if known.key == key:
                    return known
                if known.key[1:] == key[1:] and known.names is names.names:
                    pace = Pace(self.work)
                    updated = await self._update(known, names, key, row, version, pace)
                    if updated is not None:
                        self.timings["facets updated"] = pace.finish()
                        self._facets = updated
                        return updated
            pace = Pace(self.work)
            self._facets = await self._build(names, key, row, version, now, pace)
            self.facet_builds += 1
            self.timings["facets"] = pace.finish()
            return self._facets

    async def _build(
        self,
        names: Names,
        key: tuple[object, ...],
        row: Row,
        version: Version,
        now: float,
        pace: Pace,
    ) -> Facets:
        size = len(names.names)
        groups: dict[tuple[str, str], bytearray] = {}

        def mark(kind: str, value: str, at: int) -> None:
            bits = groups.get((kind, value))
            if bits is None:
                bits = groups[(kind, value)] = bytearray((size + 7) // 8)
            bits[at >> 3] |= 1 << (at & 7)

        versions = []
        for at, name in enumerate(names.names):
            versions.append(version(name))
            tags, owner, states = row(name)
            for tag in tags:
                mark("tag", tag, at)
            mark("owner", owner, at)
            for state in states:
                mark("state", state, at)
            if pace.spent():  # the clock after every job: one can take milliseconds
                await pace.pause()
        facets = Facets(key, now, names=names.names, versions=versions)
        for (kind, value), bits in groups.items():
            facets.of(kind)[value] = int.from_bytes(bits, "little")
            await pace.step(1)  # thousands of tags are thousands of integers
        return facets

    async def _update(
        self,
        known: Facets,
        names: Names,
        key: tuple[object, ...],
        row: Row,
        version: Version,
        pace: Pace,
    ) -> Facets | None:
        """``known`` with the jobs whose version changed walked again; None when so many
        changed that a build costs no more."""
        size = len(names.names)
        changed = []
        for at, name in enumerate(names.names):
            if version(name) != known.versions[at]:
                changed.append(at)
                if len(changed) > max(SLICE, size // 8):
                    return None
            if pace.spent():
                await pace.pause()
        versions = list(known.versions)
        groups: dict[tuple[str, str], list[int]] = {}
        for at in changed:
            name = names.names[at]
            versions[at] = version(name)
            tags, owner, states = row(name)
            for kind, value in (*(("tag", t) for t in tags), ("owner", owner)):
                groups.setdefault((kind, value), []).append(at)
            for state in states:
                groups.setdefault(("state", state), []).append(at)
            if pace.spent():
                await pace.pause()
        facets = Facets(key, known.built_at, names=names.names, versions=versions)
        keep = ~to_mask(changed, size)  # every bit but the changed jobs'
        for kind in ("tag", "owner", "state"):
            for value, mask in known.of(kind).items():
                if mask & keep:
                    facets.of(kind)[value] = mask & keep
                await pace.step(1)
        for (kind, value), positions in groups.items():
            chosen = facets.of(kind)
            chosen[value] = chosen.get(value, 0) | to_mask(positions, size)
            await pace.step(1)
        self.facet_updates += 1
        return facets
