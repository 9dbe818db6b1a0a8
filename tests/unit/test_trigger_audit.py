"""The trigger-stream audit in harness.chaos: every integration and chaos test's verdict rests on
it, so each kind of violation is shown to be found, and a clean log to pass."""

from __future__ import annotations

import msgspec

from harness.chaos import (
    DUPLICATED,
    EARLY,
    LATE,
    MISSING,
    OUT_OF_ORDER,
    STRAY,
    Trigger,
    due_instants,
    find_violations,
    parse_trigger,
)
from hrwcron.core.model import JobSpec
from hrwcron.core.schedule import jitter_ms

JOB = JobSpec(name="j", schedule="@every 1s", max_lateness=5)
T0 = 1_800_000_000_000


class Log:
    def __init__(self) -> None:
        self.triggers: list[Trigger] = []

    def add(
        self,
        due: int,
        *,
        stored: float | None = None,
        job: str = "j",
        msg_id: str | None = None,
        kind: str = "scheduled",
    ) -> Log:
        body = msgspec.json.encode({"job": job, "due_ms": due, "node": "n", "attempt": 1})
        headers = {
            "Nats-Msg-Id": msg_id if msg_id is not None else f"{job}:{due}",
            "Hrwcron-Job": job,
            "Hrwcron-Kind": kind,
        }
        seq = len(self.triggers) + 1
        stored_ms = due + 10 if stored is None else stored
        self.triggers.append(parse_trigger(seq, f"t.{job}", body, headers, stored_ms))
        return self

    def kinds(self, window: tuple[float, float], jobs: list[JobSpec] | None = None) -> list[str]:
        return [v.kind for v in find_violations(self.triggers, jobs or [JOB], window)]


def test_a_complete_log_is_clean() -> None:
    log = Log()
    for i in range(5):
        log.add(T0 + i * 1000)
    log.add(T0 + 1500, msg_id="j:manual:1", kind="manual")  # manual triggers are not ticks
    log.add(T0, job="other")  # jobs not audited are ignored
    assert log.kinds((T0, T0 + 4000)) == []


def test_each_violation_is_found() -> None:
    assert Log().add(T0).add(T0 + 2000).kinds((T0, T0 + 2000)) == [MISSING]
    assert Log().add(T0).add(T0, stored=T0 + 30).kinds((T0, T0)) == [DUPLICATED]
    assert Log().add(T0, stored=T0 - 60).kinds((T0, T0)) == [EARLY]
    assert Log().add(T0, stored=T0 - 40).kinds((T0, T0)) == []  # within the tolerance
    assert Log().add(T0, stored=T0 + 5001).kinds((T0, T0)) == [LATE]
    assert Log().add(T0 + 1000).add(T0).kinds((T0, T0 + 1000)) == [OUT_OF_ORDER]
    assert Log().add(T0 + 500).kinds((T0 + 1, T0 + 999)) == [STRAY]
    assert Log().add(T0, msg_id="j:1").kinds((T0, T0)) == [STRAY]


def test_missing_is_only_judged_inside_the_window() -> None:
    log = Log().add(T0 + 3000)
    assert log.kinds((T0 + 3000, T0 + 3000)) == []
    assert log.kinds((T0, T0 + 3000)) == [MISSING] * 3


def test_jitter_moves_the_fire_instant() -> None:
    jittered = JobSpec(name="j", schedule="@every 1s", jitter=0.5)
    offset = jitter_ms("j", 0.5)
    assert offset > 100, "pick a name whose jitter is not tiny"
    assert Log().add(T0, stored=T0 + offset).kinds((T0, T0), [jittered]) == []
    assert Log().add(T0, stored=T0 + 10).kinds((T0, T0), [jittered]) == [EARLY]


def test_due_instants_are_inclusive() -> None:
    assert due_instants(JOB, T0, T0 + 2000) == [T0, T0 + 1000, T0 + 2000]
    assert due_instants(JOB, T0 + 1, T0 + 999) == []


def test_due_instants_of_a_long_window_are_not_cut_by_a_search_bound() -> None:
    hour = due_instants(JOB, T0, T0 + 3_600_000)
    assert len(hour) == 3_601 and hour[-1] == T0 + 3_600_000
