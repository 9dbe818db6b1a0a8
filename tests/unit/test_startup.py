"""Start-up rides out an election: what goes away by itself is retried with a capped backoff
up to the bound, logged once and summed up once; what no retry changes ends it at once; and a
scheduler whose start failed leaves nothing behind for the next attempt to trip over."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Collection

import nats.errors
import pytest
from nats.js.errors import APIError, ServiceUnavailableError

from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryClaims, MemoryJobs, MemoryMembers, MemoryTriggers
from hrwcron.core.config import load_config
from hrwcron.core.errors import (
    ConfigError,
    DuplicateNodeError,
    NatsSetupError,
    StreamConfigError,
)
from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import JobEvent, NullObserver, StoreUnavailable
from hrwcron.engine.scheduler import Scheduler, Settings
from hrwcron.process.startup import (
    FIRST_WAIT_S,
    MAX_WAIT_S,
    refused,
    start_with_retries,
    transient,
)


class FakeTime:
    """Sleeps that only move a clock, so the backoff can be read off exactly."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


def failing(errors: list[BaseException], result: str = "started") -> tuple[object, list[int]]:
    calls: list[int] = []

    async def attempt() -> str:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return result

    return attempt, calls


async def test_transient_errors_are_retried_with_a_doubling_capped_backoff_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeTime()
    errors: list[BaseException] = [
        nats.errors.NoRespondersError(),
        ServiceUnavailableError(description="JetStream system temporarily unavailable"),
        nats.errors.TimeoutError(),
        StoreUnavailable("timed out after 30 s loading the trigger history"),
        TimeoutError(),
        nats.errors.TimeoutError(),
        nats.errors.TimeoutError(),
    ]
    attempt, calls = failing(errors)
    with caplog.at_level(logging.INFO, logger="hrwcron.app"):
        result = await start_with_retries(
            attempt,  # type: ignore[arg-type]
            bound_s=60,
            sleep=clock.sleep,
            monotonic=clock.monotonic,
        )
    assert result == "started"
    assert len(calls) == 8
    assert clock.sleeps == [0.25, 0.5, 1.0, 2.0, 4.0, MAX_WAIT_S, MAX_WAIT_S]
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "not serving yet (NoRespondersError" in lines[0]
    assert "retrying for up to 60 s" in lines[0]
    assert lines[1] == "start-up: JetStream served after 8 attempts in 17.8 s"


async def test_a_start_that_succeeds_at_once_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    attempt, calls = failing([])
    with caplog.at_level(logging.DEBUG, logger="hrwcron.app"):
        await start_with_retries(attempt, bound_s=60)  # type: ignore[arg-type]
    assert calls == [1] and caplog.records == []


async def test_past_the_bound_it_gives_up_with_how_long_how_often_and_the_last_error() -> None:
    clock = FakeTime()
    attempt, calls = failing([nats.errors.NoRespondersError()] * 100)
    with pytest.raises(NatsSetupError) as raised:
        await start_with_retries(
            attempt,  # type: ignore[arg-type]
            bound_s=10,
            sleep=clock.sleep,
            monotonic=clock.monotonic,
        )
    # 0.25 + 0.5 + 1 + 2 + 4 = 7.75, then the last wait is cut to what is left of the bound.
    assert clock.sleeps == [0.25, 0.5, 1.0, 2.0, 4.0, 2.25]
    assert clock.now == 10
    assert len(calls) == 7
    text = str(raised.value)
    assert text.startswith("NATS did not serve JetStream within 10 s (7 attempts; last: ")
    assert "NoRespondersError" in text


@pytest.mark.parametrize(
    "error",
    [
        StreamConfigError("stream HRWCRON_TRIGGERS has duplicate_window 30 s"),
        DuplicateNodeError("node id 'r0' is already used by a live replica"),
        NatsSetupError("NATS refused this replica's credentials"),
        APIError(code=503, err_code=10039, description="jetstream not enabled for account"),
        APIError(
            code=500, err_code=10074, description="replicas > 1 not supported in non-clustered mode"
        ),
        ValueError("a bug is no election"),
    ],
)
async def test_what_no_retry_changes_ends_the_start_at_once(error: Exception) -> None:
    clock = FakeTime()
    attempt, calls = failing([error])
    with pytest.raises(type(error)):
        await start_with_retries(
            attempt,  # type: ignore[arg-type]
            bound_s=60,
            sleep=clock.sleep,
            monotonic=clock.monotonic,
        )
    assert calls == [1] and clock.sleeps == []


def test_transient_knows_an_election_from_a_configuration() -> None:
    assert transient(ServiceUnavailableError())
    assert transient(APIError(code=500, err_code=10009, description="cluster can not handle"))
    assert transient(nats.errors.TimeoutError())
    assert not transient(asyncio.CancelledError())
    assert not transient(StreamConfigError("bad bucket"))


def test_a_request_refused_for_want_of_permission_is_no_election() -> None:
    violation = 'nats: permissions violation for publish to "$JS.API.STREAM.INFO.KV_x"'
    problem = refused(nats.errors.TimeoutError(), [violation])
    assert problem is not None
    assert violation in str(problem) and "scheduler role" in str(problem)
    assert refused(nats.errors.TimeoutError(), []) is None
    # Already a clear error of its own: left as it is.
    assert refused(StreamConfigError("bad bucket"), [violation]) is None
    assert FIRST_WAIT_S == 0.25


def test_the_bound_is_a_setting_of_a_minute_by_default() -> None:
    assert load_config(None, {}).scheduler.startup_timeout == 60.0
    env = {"HRWCRON_SCHEDULER_STARTUP_TIMEOUT": "5s"}
    assert load_config(None, env).scheduler.startup_timeout == 5.0
    with pytest.raises(ConfigError, match="startup_timeout"):
        load_config(None, {"HRWCRON_SCHEDULER_STARTUP_TIMEOUT": "0s"})


# --- the scheduler leaves nothing behind ------------------------------------------------------

SETTINGS = Settings(
    node_id="solo",
    heartbeat_interval=0.1,
    member_ttl=0.8,
    membership_refresh=0.1,
    shutdown_timeout=1.0,
)


class SilentJobs(MemoryJobs):
    """A jobs bucket whose watch never delivers its first snapshot, as during an election."""

    async def watch(self, lanes: Collection[str] | None = None) -> AsyncIterator[JobEvent | None]:
        await asyncio.Event().wait()
        yield None


class TricklingJobs(MemoryJobs):
    """A job list that arrives slowly but steadily (a million jobs on a busy machine): a job
    every 20 s, 10 of them, far longer than a silent store is waited for."""

    async def watch(self, lanes: Collection[str] | None = None) -> AsyncIterator[JobEvent | None]:
        for i in range(10):
            await asyncio.sleep(20)
            yield JobEvent(f"slow{i}", JobSpec(name=f"slow{i}", schedule="@hourly"), i + 1)
        yield None
        await asyncio.Event().wait()


def scheduler(members: MemoryMembers, jobs: MemoryJobs) -> Scheduler:
    return Scheduler(
        SETTINGS,
        members=members,
        claims=MemoryClaims(),
        triggers=MemoryTriggers(600.0),
        jobs=jobs,
        observer=NullObserver(),
    )


async def test_a_failed_start_stops_its_loops_and_leaves_so_the_next_one_starts() -> None:
    members = MemoryMembers(SETTINGS.member_ttl)
    first = scheduler(members, SilentJobs())
    with pytest.raises(StoreUnavailable, match="loading the job list"):
        await first.start()
    assert first._tasks == set() or all(task.done() for task in first._tasks)
    assert "solo" not in await members.snapshot()
    second = scheduler(members, MemoryJobs())
    await asyncio.wait_for(second.start(), timeout=5)
    try:
        assert (await members.snapshot())["solo"].heartbeat.instance == second.instance
    finally:
        await second.stop()


async def test_a_start_refused_for_a_live_node_id_leaves_that_replica_alone() -> None:
    members = MemoryMembers(SETTINGS.member_ttl)
    live = scheduler(members, MemoryJobs())
    await live.start()
    try:
        with pytest.raises(DuplicateNodeError):
            await scheduler(members, MemoryJobs()).start()
        assert (await members.snapshot())["solo"].heartbeat.instance == live.instance
    finally:
        await live.stop()


async def test_a_job_list_that_keeps_arriving_is_waited_for_however_long_it_takes() -> None:
    members = MemoryMembers(SETTINGS.member_ttl)
    slow = scheduler(members, TricklingJobs())
    await asyncio.wait_for(slow.start(), timeout=600)
    try:
        assert sorted(slow.jobs) == [f"slow{i}" for i in range(10)]
    finally:
        await slow.stop()
