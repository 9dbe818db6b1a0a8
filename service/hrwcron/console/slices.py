"""Building the console's index in slices: a build counts its work and lets the event loop
run ticks again after SLICE items or TURN_S of it, whichever comes first, and times the
longest turn it held the loop for."""

from __future__ import annotations

import asyncio
import time

# The most items (names sorted, merged or checked; jobs walked for facets) a build handles in
# one turn of the event loop, and the most time: whichever comes first.
SLICE = 2_000
TURN_S = 0.005

__all__ = ["SLICE", "TURN_S", "Pace", "Work"]


class Work:
    """What the builds did, over every build (the tests watch it between turns): items
    handled in Python, merges of sorted runs in C (each a turn of its own), and how many times
    a build let the event loop run."""

    __slots__ = ("done", "merges", "turns")

    def __init__(self) -> None:
        self.done = 0
        self.merges = 0
        self.turns = 0


class Pace:
    """One build's pace: lets the event loop run after SLICE items or TURN_S, and times the
    longest turn the build held it for."""

    __slots__ = ("_began", "_since", "_start", "longest_s", "work")

    def __init__(self, work: Work) -> None:
        self.work = work
        self.longest_s = 0.0
        self._since = 0
        self._began = self._start = time.perf_counter()

    def spent(self, items: int = 1) -> bool:
        """Count ``items``; True when the caller should yield (``await pause()``)."""
        self.work.done += items
        self._since += items
        return self._since >= SLICE or time.perf_counter() - self._began > TURN_S

    async def pause(self) -> None:
        self._held()
        self.work.turns += 1
        await asyncio.sleep(0)
        self._since = 0
        self._began = time.perf_counter()

    async def step(self, items: int) -> None:
        if self.spent(items):
            await self.pause()

    def _held(self) -> None:
        self.longest_s = max(self.longest_s, time.perf_counter() - self._began)

    def finish(self) -> tuple[float, float]:
        """The longest turn and the whole build, in seconds."""
        self._held()
        return self.longest_s, time.perf_counter() - self._start
