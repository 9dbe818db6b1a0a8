"""The scheduler's invariants on real nats-server processes, with replicas as real processes.

Each test runs three ``hrwcron run`` replicas against a single server or the 3-node cluster,
injects one fault (SIGKILL, SIGSTOP at the failpoint between claim and publish, a NATS node
killed, every replica down, a replica cut off from NATS), then audits the whole trigger stream
with ``harness.chaos``: every due tick of every job in the window exactly once, none early by the
server's clock, none past its lateness deadline, each job's ticks in due order.

Jobs fire every second (the finest schedule), so a few seconds cover dozens of ticks per job.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import StreamConfig

from harness import NatsCluster, NatsServer, TcpProxy, wait_for_async
from harness.chaos import (
    ReplicaFleet,
    Trigger,
    TriggerLog,
    describe,
    now_ms,
    summary,
    wait_until_ms,
)
from harness.timings import QUICK, SHIPPED, Timings
from hrwcron.core import hrw
from hrwcron.core.model import JobSpec
from hrwcron.process.app import Stores, open_stores

STREAM = "HRWCRON_TRIGGERS"
NODES = ["r0", "r1", "r2"]
# How long after its turn a replica may take to claim and publish on a busy 2-core machine:
# the bound the failover invariant allows on top of the failover step.
SLACK_MS = 500


def every_second(count: int, prefix: str = "job", **kwargs: Any) -> list[JobSpec]:
    return [JobSpec(name=f"{prefix}{i:02d}", schedule="@every 1s", **kwargs) for i in range(count)]


def next_second(ms: float, seconds: int = 1) -> int:
    return (int(ms) // 1000 + seconds) * 1000


@dataclass
class Run:
    """Replicas, the test's own connection and the trigger stream of one scenario."""

    fleet: ReplicaFleet
    stores: Stores
    log: TriggerLog
    jobs: list[JobSpec]
    written_ms: float  # the jobs were stored before this instant

    async def settle(self, until_ms: float, timeout: float = 60.0) -> list[Trigger]:
        """Wait until every job's tick due at ``until_ms`` is in the stream."""
        return await self.log.wait_covered(self.jobs, until_ms, timeout)

    def violations(self, window: tuple[float, float], jobs: Sequence[JobSpec] = ()) -> str:
        found = self.log.check_exactly_once(jobs or self.jobs, window)
        if not found:
            return ""
        return describe(found) + f"\nper node: {summary(self.log.triggers)}"


Launch = Callable[..., Awaitable[Run]]


@pytest.fixture
async def launch(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Launch]:
    """``await launch(url, jobs, env=..., extra={index: env}, timings=...)``: store the jobs,
    start the replicas (at quick timings unless told), return the :class:`Run`. Everything is
    torn down after the test; on failure the replicas' logs are printed."""
    runs: list[Run] = []

    async def start(
        url: str,
        jobs: list[JobSpec],
        *,
        env: Mapping[str, str] | None = None,
        extra: Mapping[int, Mapping[str, str]] | None = None,
        urls: Mapping[int, str] | None = None,
        count: int = 3,
        timings: Timings = QUICK,
    ) -> Run:
        logs = tmp_path / f"replicas{len(runs)}"
        fleet = ReplicaFleet(url, count, logs, env=env, timings=timings)
        stores = await open_stores(fleet.config())
        run = Run(fleet, stores, TriggerLog(stores.client), jobs, 0.0)
        runs.append(run)
        for job in jobs:
            await stores.jobs.put(job, None)
        run.written_ms = now_ms()
        for i in range(count):
            own = dict((extra or {}).get(i, {}))
            if urls and i in urls:
                own["HRWCRON_NATS_URL"] = urls[i]
            fleet.start(i, own, wait=False)
        for i in range(count):
            fleet.wait_started(i)
        return run

    try:
        yield start
    finally:
        failed = any(
            getattr(getattr(request.node, f"_hrwcron_rep_{when}", None), "failed", False)
            for when in ("setup", "call")
        )
        for run in runs:
            run.fleet.stop_all()
            if failed:
                print(run.fleet.dump_logs())
            with contextlib.suppress(Exception):
                await run.stores.client.close()


def owner(job: str, nodes: Sequence[str] = NODES) -> str:
    return hrw.rank(job, list(nodes))[0]


# --- (a) exactly once under normal operation ---------------------------------------------------


async def _fifty_jobs_for_twenty_seconds(run: Run) -> None:
    end = run.written_ms + 20_000
    await run.settle(end)
    # From the moment the jobs existed: ticks due while replicas were still starting count too.
    assert run.violations((run.written_ms, end)) == ""
    assert {t.node for t in run.log.triggers} == set(NODES)


async def test_three_replicas_fire_each_tick_once(nats_server: NatsServer, launch: Launch) -> None:
    # At the shipped timings, as users run it; the cluster variant below runs quick.
    run = await launch(nats_server.url, every_second(50), timings=SHIPPED)
    await _fifty_jobs_for_twenty_seconds(run)


@pytest.mark.cluster
async def test_three_replicas_fire_each_tick_once_on_a_cluster(
    nats_cluster: NatsCluster, launch: Launch
) -> None:
    run = await launch(nats_cluster.url, every_second(50), env={"HRWCRON_SCHEDULER_REPLICAS": "3"})
    info = await run.stores.client.jetstream().stream_info(STREAM)
    assert info.config.num_replicas == 3
    await _fifty_jobs_for_twenty_seconds(run)


# --- (b) a replica is killed ------------------------------------------------------------------


async def test_killed_replica_is_replaced_within_a_failover_step(
    nats_server: NatsServer, launch: Launch
) -> None:
    """At the shipped timings: the failover bound users rely on is the default step's."""
    step, lease, ttl = SHIPPED.failover_step_ms, SHIPPED.claim_lease_ms, SHIPPED.member_ttl_ms
    jobs = every_second(24)
    run = await launch(nats_server.url, jobs, timings=SHIPPED)
    await run.settle(next_second(now_ms()))
    victim = 1
    orphans = [j.name for j in jobs if owner(j.name) == NODES[victim]]
    assert orphans, "the victim must own some jobs"
    # Killed between two bursts of ticks, so the crash is of a replica, not of a claim.
    await wait_until_ms(next_second(now_ms()) + 500, what="the middle of a second")
    run.fleet.kill(victim)
    killed = now_ms()
    end = next_second(killed, 8)
    await run.settle(end)
    assert run.violations((run.written_ms, end)) == ""

    after = [t for t in run.log.triggers if t.due_ms > killed]
    assert not [t for t in after if t.node == NODES[victim]]
    too_late = [
        t
        for t in after
        # A tick whose claim died with the victim is taken over once the lease has run out.
        if t.lateness_ms > step + SLACK_MS + (lease if t.attempt > 1 else 0)
    ]
    assert too_late == [], [(t.msg_id, t.node, t.attempt, round(t.lateness_ms)) for t in too_late]
    # Before the victim's heartbeat expired, its jobs went to the next candidate after one step.
    failed_over = [
        t
        for t in after
        if t.job in orphans and t.due_ms < killed + ttl - 500
        if t.lateness_ms >= step - 50
    ]
    assert failed_over, "no tick of the victim's jobs went through the failover path"


# --- (c) frozen between claim and publish -------------------------------------------------------


async def test_replica_frozen_after_claiming_does_not_duplicate_when_it_wakes(
    nats_server: NatsServer, launch: Launch
) -> None:
    """The owner SIGSTOPs itself right after claiming a tick, stays stopped longer than the
    member TTL, the claim lease and the stream's duplicate window, and then finishes what it
    started. The others take the claim over and fire the tick; the woken replica's publish
    carries a stale expected subject sequence and the stream refuses it.

    The duplicate window is shrunk to 2 s after the replicas started: provisioning rightly
    refuses a window shorter than the lateness window, and with a short lateness the woken
    replica would give up before publishing. This way its late publish really reaches the
    stream, with nothing but the fence to stop it."""
    jobs = every_second(8, max_lateness=30)
    frozen = next(j.name for j in jobs if owner(j.name) == "r0")
    run = await launch(
        nats_server.url,
        jobs,
        extra={0: {"HRWCRON_FAILPOINTS": f"after_claim=stop@{frozen}"}},
    )
    js = run.stores.client.jetstream()
    config: StreamConfig = (await js.stream_info(STREAM)).config
    config.duplicate_window = 2.0
    await js.update_stream(config)
    assert (await js.stream_info(STREAM)).config.duplicate_window == 2.0

    run.fleet.wait_failpoint(0, "after_claim", frozen)
    stopped = now_ms()
    await wait_for_async(
        lambda: run.fleet.stopped_by_signal(0), timeout=10, message="r0 stopped itself"
    )
    await run.settle(stopped + 3000)
    # The others fired the frozen tick by taking the claim over (attempt 2), exactly once.
    taken = [t for t in run.log.of(frozen) if t.attempt > 1]
    assert [(t.node != "r0", t.attempt) for t in taken] == [(True, 2)], taken
    frozen_due = taken[0].due_ms
    assert "took over the claim of r0" in run.fleet.output(1) + run.fleet.output(2)
    await wait_until_ms(
        max(stopped + QUICK.member_ttl_ms + QUICK.claim_lease_ms, taken[0].stored_ms + 2000) + 1000,
        what="a pause longer than the TTL, the lease and the duplicate window",
    )
    assert run.fleet.stopped_by_signal(0)
    run.fleet.resume(0)
    # Woken, it publishes what it had prepared; the stream fences it off.
    run.fleet.proc(0).wait_for_log(rf"tick {frozen}:{frozen_due}: fenced", timeout=20)
    resumed = now_ms()
    end = next_second(resumed, 4)
    await run.settle(end)
    assert run.violations((run.written_ms, end)) == ""
    # And it is a full member again: it fires ticks as before.
    await wait_for_async(
        lambda: _fired_by(run, "r0", after_ms=resumed),
        timeout=30,
        message="r0 firing again after it woke",
    )


async def _fired_by(run: Run, node: str, *, after_ms: float) -> bool:
    await run.log.read()
    return any(t.node == node and t.due_ms > after_ms for t in run.log.triggers)


# --- (d) a NATS node dies -----------------------------------------------------------------------


@pytest.mark.cluster
async def test_killing_the_stream_leader_loses_and_duplicates_nothing(
    nats_cluster: NatsCluster, launch: Launch
) -> None:
    jobs = every_second(20)
    run = await launch(nats_cluster.url, jobs, env={"HRWCRON_SCHEDULER_REPLICAS": "3"})
    await run.settle(next_second(now_ms(), 2))
    leader = nats_cluster.wait_stream_leader(STREAM)
    nats_cluster.kill(leader)
    killed = now_ms()
    new_leader = nats_cluster.wait_stream_leader(STREAM, exclude=[leader], timeout=30)
    assert new_leader != leader
    end = next_second(killed, 10)
    await run.settle(end, timeout=90)
    # Every tick, the ones due during the election included, once and inside its lateness.
    assert run.violations((run.written_ms, end)) == ""


# --- (e) every replica down, then one back --------------------------------------------------


async def test_replica_restarted_after_an_outage_catches_up(
    nats_server: NatsServer, launch: Launch
) -> None:
    all_ticks = JobSpec(name="catchup-all", schedule="@every 1s", catchup="all")
    latest = JobSpec(name="catchup-latest", schedule="@every 1s", catchup="latest")
    run = await launch(nats_server.url, [all_ticks, latest])
    await run.settle(next_second(now_ms(), 1))
    for i in range(3):
        run.fleet.kill(i)
    await run.log.read()
    before = {job.name: run.log.newest_due(job.name) or 0 for job in run.jobs}
    # Longer than the member TTL, so the restarted replica's old membership has expired too.
    await wait_until_ms(max(before.values()) + 5000, what="an outage of every replica")
    restarted = now_ms()
    run.fleet.start(0)
    end = next_second(now_ms(), 3)
    await run.settle(end)

    # catchup = "all": every tick of the outage, late but inside the lateness window, once.
    assert run.violations((run.written_ms, end), [all_ticks]) == ""
    missed = [t for t in run.log.of(all_ticks.name) if before[all_ticks.name] < t.due_ms]
    assert missed[0].due_ms == before[all_ticks.name] + 1000
    assert missed[0].lateness_ms > 3000  # it really was caught up, not fired on time

    # catchup = "latest": only the newest missed tick, then on schedule.
    dues = [t.due_ms for t in run.log.of(latest.name) if t.due_ms > before[latest.name]]
    assert dues[0] - before[latest.name] >= 4000, dues
    assert dues[0] >= int(restarted) // 1000 * 1000 - 1000, (dues, restarted)
    assert dues == list(range(dues[0], dues[-1] + 1, 1000))
    # (Ticks due before the first replica started were collapsed the same way.)
    first = run.log.of(latest.name)[0].due_ms
    assert run.violations((first, before[latest.name]), [latest]) == ""
    assert run.violations((dues[0], end), [latest]) == ""


# --- (f) a replica loses NATS ---------------------------------------------------------------


@pytest.mark.parametrize("fault", ["drop", "stall"])
async def test_replica_cut_off_from_nats_stops_claiming(
    nats_server: NatsServer, launch: Launch, fault: str
) -> None:
    jobs = every_second(20)
    with TcpProxy.to(nats_server) as proxy:
        run = await launch(nats_server.url, jobs, urls={2: proxy.url})
        await wait_for_async(
            lambda: _fired_by(run, "r2", after_ms=0), timeout=30, message="r2 firing"
        )
        proxy.set_mode(fault)
        cut = now_ms()
        # Long enough for r2's membership to expire twice over while it is cut off.
        await run.settle(next_second(cut, 2) + 2 * QUICK.member_ttl_ms)
        proxy.passthrough()
        healed = now_ms()
        # Nothing of r2's for ticks due while it was cut off, not even a stalled write landing
        # after the network came back; the others fired all of them.
        end = next_second(healed, 2)
        await run.settle(end)
        during = [
            t
            for t in run.log.by_node("r2")
            if cut < t.due_ms < healed or cut + 500 < t.stored_ms < healed
        ]
        assert during == [], during
        assert run.violations((run.written_ms, end)) == ""
        # Back on the network it rejoins and takes its share again.
        await wait_for_async(
            lambda: _fired_by(run, "r2", after_ms=healed),
            timeout=30,
            message="r2 firing again after the network healed",
        )
        end = next_second(now_ms(), 1)
        await run.settle(end)
        assert run.violations((run.written_ms, end)) == ""
