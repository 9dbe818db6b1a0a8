"""What went wrong lately, as this replica decided it: per job its last few troubled ticks
(missed, fenced, rejected, failed writes), and per minute of the last hour how many triggers it
published, how many late and how many ticks it missed. The console shows them; each replica
counts the ticks it decided, so a job's problems are on its owner's console.

Bounded whatever happens: a few entries per job, a bounded number of jobs (the least recently
troubled forgotten first), sixty minutes.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

from hrwcron.core.outcomes import PROBLEMS, Outcome

PER_JOB = 20
MAX_JOBS = 10_000
MINUTE_MS = 60_000
HOUR_MS = 3_600_000
# A published trigger later than this after its due instant counts as late.
LATE_MS = 1_000.0


@dataclass(frozen=True, slots=True)
class Trouble:
    outcome: Outcome
    due_ms: int
    at_ms: float


@dataclass(slots=True)
class Minute:
    start_ms: int
    published: int = 0
    late: int = 0
    missed: int = 0
    worst_ms: float = 0.0


class TickLog:
    def __init__(self) -> None:
        self._jobs: collections.OrderedDict[str, collections.deque[Trouble]] = (
            collections.OrderedDict()
        )
        self._minutes: collections.deque[Minute] = collections.deque()

    def note(
        self, job: str, outcome: Outcome, due_ms: int, lateness_ms: float | None, now: float
    ) -> None:
        if outcome == Outcome.STARTED:
            minute = self._minute(now)
            minute.published += 1
            late = lateness_ms or 0.0
            minute.worst_ms = max(minute.worst_ms, late)
            minute.late += late > LATE_MS
            return
        if outcome not in PROBLEMS:
            return
        if outcome == Outcome.MISSED:
            self._minute(now).missed += 1
        troubles = self._jobs.pop(job, None) or collections.deque(maxlen=PER_JOB)
        troubles.append(Trouble(outcome, due_ms, now))
        self._jobs[job] = troubles
        while len(self._jobs) > MAX_JOBS:
            self._jobs.popitem(last=False)

    def _minute(self, now: float) -> Minute:
        start = int(now) // MINUTE_MS * MINUTE_MS
        if not self._minutes or self._minutes[-1].start_ms < start:
            self._minutes.append(Minute(start))
        while self._minutes and self._minutes[0].start_ms <= now - HOUR_MS - MINUTE_MS:
            self._minutes.popleft()
        return self._minutes[-1]

    def troubles(self, job: str) -> list[Trouble]:
        """The job's troubled ticks, newest first."""
        return list(reversed(self._jobs.get(job, ())))

    def missed_since(self, since_ms: float) -> set[str]:
        return {
            job
            for job, troubles in self._jobs.items()
            if any(t.outcome == Outcome.MISSED and t.at_ms >= since_ms for t in troubles)
        }

    def minutes(self, now: float) -> list[Minute]:
        """The last hour's minutes that saw anything, oldest first."""
        return [m for m in self._minutes if m.start_ms > now - HOUR_MS - MINUTE_MS]
