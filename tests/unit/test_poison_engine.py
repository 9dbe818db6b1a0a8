"""A job the server will not take fails its own ticks, never the replica: the engine over the
in-memory stores, with the refusals a real stream gives."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest

from harness import wait_for_async
from harness.memory_cluster import Cluster, every_second, now_ms, second_after
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.jetstream.pipeline import message_size
from hrwcron.adapters.memory import MemoryTriggers
from hrwcron.core.errors import ScheduleError
from hrwcron.core.model import TRIGGER_ENVELOPE, JobSpec, TriggerMessage, encode
from hrwcron.core.ticks import format_ms, manual_claim_key
from hrwcron.engine import decisions as decisions_module
from hrwcron.engine import jobs as jobs_module
from hrwcron.engine.ports import (
    HEADER_DUE,
    HEADER_JOB,
    HEADER_KIND,
    HEADER_MSG_ID,
    HEADER_WATERMARK,
    FenceConflict,
    Published,
    StoreRefused,
    TriggerWrite,
)


def _failed(error: Exception) -> asyncio.Future[Published]:
    future: asyncio.Future[Published] = asyncio.get_running_loop().create_future()
    future.set_exception(error)
    return future


class RefusingTriggers(MemoryTriggers):
    """A stream that refuses every trigger on ``refused`` subjects, as JetStream answers a
    message over its size limit, and reports a fence conflict while ``conflicts`` is set."""

    def __init__(self) -> None:
        super().__init__(600.0)
        self.refused: set[str] = set()
        self.conflicts = False
        self.refusals = 0

    def _refusal(self, subject: str) -> Exception | None:
        if subject in self.refused:
            self.refusals += 1
            why = "message size exceeds maximum allowed (JetStream error 10054)"
            return StoreRefused(why, err_code=10054)
        if self.conflicts:
            return FenceConflict("wrong last sequence")
        return None

    async def publish(
        self, subject: str, body: bytes, headers: Mapping[str, str], expected_last_seq: int
    ) -> Published:
        refusal = self._refusal(subject)
        if refusal is not None:
            raise refusal
        return await super().publish(subject, body, headers, expected_last_seq)

    async def publish_many(self, writes: Sequence[TriggerWrite]) -> list[asyncio.Future[Published]]:
        answers: list[asyncio.Future[Published]] = []
        for write in writes:
            refusal = self._refusal(write[0])
            if refusal is not None:
                answers.append(_failed(refusal))
            else:
                answers += await super().publish_many([write])
        return answers


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    cluster = Cluster()
    cluster.triggers = RefusingTriggers()
    try:
        yield cluster
    finally:
        await cluster.stop_all()


def refusing(cluster: Cluster) -> RefusingTriggers:
    assert isinstance(cluster.triggers, RefusingTriggers)
    return cluster.triggers


async def test_a_refused_trigger_fails_that_tick_once_and_marks_the_job(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="hrwcron.scheduler")
    poison, good = every_second("poison"), every_second("good")
    refusing(cluster).refused.add(poison.trigger_subject())
    await cluster.put(poison, good)
    replicas = await cluster.start_all(["a", "b"])
    start = now_ms()
    await cluster.run_until([good], second_after(start, 4))

    assert cluster.of("poison") == []
    assert len(cluster.of("good")) >= 4
    rejected = [
        o
        for r in replicas
        for o in r.recorder.decisions
        if o.job == "poison" and o.outcome == "rejected"
    ]
    dues = [o.due_ms for o in rejected]
    assert len(dues) >= 3
    # Each tick is tried by one replica once: the refusal resolves it for every replica.
    assert len(dues) == len(set(dues)) == refusing(cluster).refusals
    problems = [r.scheduler.problem_of("poison") for r in replicas]
    assert any("refused its trigger" in p and "10054" in p for p in problems), problems
    assert all(r.scheduler.problem_of("good") == "" for r in replicas)
    # Logged once per replica that met it, not once per tick or retry.
    lines = [r for r in caplog.records if "poison" in r.getMessage()]
    assert 1 <= len(lines) <= len(replicas), [r.getMessage() for r in lines]
    assert all(r.scheduler.ready for r in replicas)


async def test_a_manual_trigger_that_was_not_published_gives_its_claim_back(
    cluster: Cluster,
) -> None:
    job = JobSpec(name="manual", schedule="@every 1h")
    await cluster.put(job)
    (replica,) = await cluster.start_all(["a"])
    msg_id, key = "manual:manual:retry-me", manual_claim_key("manual", "retry-me")

    refusing(cluster).conflicts = True
    first = await replica.scheduler.publish_unscheduled("manual", msg_id, 1, "manual", key)
    assert first == "lock_busy"
    assert await cluster.claims.get(key) is None  # given back

    refusing(cluster).conflicts = False
    retry = await replica.scheduler.publish_unscheduled("manual", msg_id, 1, "manual", key)
    assert retry == "started"
    assert [m.headers["Nats-Msg-Id"] for m in cluster.triggers.messages] == [msg_id]
    again = await replica.scheduler.publish_unscheduled("manual", msg_id, 1, "manual", key)
    assert again == "duplicate"
    assert len(cluster.triggers.messages) == 1


async def test_a_job_the_engine_cannot_plan_is_skipped_and_the_watch_goes_on(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_first_due = jobs_module.first_due

    def first_due(plan: Any, **kwargs: Any) -> int:
        if plan.schedule.expr == "@every 7s":
            raise ScheduleError("instant: 1e20 ms is outside the supported years 1800-8999")
        return real_first_due(plan, **kwargs)

    monkeypatch.setattr(jobs_module, "first_due", first_due)
    bad, good = JobSpec(name="unplannable", schedule="@every 7s"), every_second("good")
    await cluster.put(bad, good)
    (replica,) = await cluster.start_all(["a"])
    await cluster.run_until([good], second_after(now_ms(), 2))
    assert "unplannable" not in replica.scheduler.jobs
    assert "good" in replica.scheduler.jobs
    # A job written after it is still picked up: the watch did not stop on the bad one.
    later = every_second("later")
    await cluster.put(later)
    await wait_for_async(
        lambda: "later" in replica.scheduler.jobs, timeout=10, message="later loaded"
    )


def test_a_trigger_envelope_at_its_longest_fits_the_room_kept_for_it() -> None:
    name = ".".join(["n" * 64] * 8)
    tick = f"{name}:manual:{'i' * 64}"
    body = encode(
        TriggerMessage(
            job=name,
            tick=tick,
            due=format_ms(221_845_391_999_999),
            due_ms=221_845_391_999_999,
            fired_at=format_ms(221_845_391_999_999),
            node="n" * 64,
            attempt=2**63,
            payload=None,
            kind="backfill",
        )
    )
    headers = {
        HEADER_MSG_ID: tick,
        HEADER_JOB: name,
        HEADER_DUE: format_ms(221_845_391_999_999),
        HEADER_WATERMARK: str(-(2**63)),
        HEADER_KIND: "backfill",
        "Nats-Expected-Last-Subject-Sequence": str(2**64),
        "traceparent": "00-" + "f" * 32 + "-" + "f" * 16 + "-01",
        "tracestate": "x" * 512,
    }
    assert message_size(body, headers) - len(b"null") < TRIGGER_ENVELOPE / 2


async def test_holding_a_share_a_job_that_cannot_be_planned_once_read_stops_no_other(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_collapse = decisions_module.collapse_latest

    def collapse_latest(plan: Any, due_ms: int, now_ms: float) -> Any:
        if plan.schedule.expr == "@every 7s":
            raise ScheduleError("instant: 1e20 ms is outside the supported years 1800-8999")
        return real_collapse(plan, due_ms, now_ms)

    monkeypatch.setattr(decisions_module, "collapse_latest", collapse_latest)
    bad = JobSpec(name="unplannable", schedule="@every 7s", catchup="latest")
    good = every_second("good")
    await cluster.put(bad, good)
    replica = await cluster.start("a", holders=2)  # reads each subject, then plans the job
    await cluster.run_until([good], second_after(now_ms(), 2))
    assert "cannot be scheduled" in replica.scheduler.problem_of("unplannable")
    assert replica.scheduler.jobs["unplannable"].due is None
    assert not cluster.of("unplannable")
