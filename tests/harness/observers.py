"""The one recording observer of the tests: every tick decision a replica reports, and its
readiness changes, for tests that assert what the engine decided."""

from __future__ import annotations

from dataclasses import dataclass, field

from hrwcron.engine.ports import NullObserver


@dataclass(frozen=True, slots=True)
class Decision:
    node: str
    job: str
    outcome: str
    due_ms: int
    rank: int
    attempt: int
    lateness_ms: float | None


@dataclass
class RecordingObserver(NullObserver):
    node: str = ""
    decisions: list[Decision] = field(default_factory=list)
    readiness_log: list[tuple[bool, str]] = field(default_factory=list)

    def outcome(
        self,
        job: str,
        outcome: str,
        *,
        due_ms: int,
        rank: int,
        attempt: int,
        lateness_ms: float | None,
    ) -> None:
        self.decisions.append(Decision(self.node, job, outcome, due_ms, rank, attempt, lateness_ms))

    def readiness(self, ready: bool, reason: str) -> None:
        self.readiness_log.append((ready, reason))

    def count(self, job: str, outcome: str) -> int:
        return sum(1 for d in self.decisions if d.job == job and d.outcome == outcome)

    def of(self, job: str) -> list[tuple[str, int]]:
        """The job's decisions as (outcome, due ms), in the order they were made."""
        return [(d.outcome, d.due_ms) for d in self.decisions if d.job == job]
