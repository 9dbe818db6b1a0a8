"""Chaos runs: real replicas and a real 3-node JetStream cluster under combined faults, then
every tick of the window audited on the trigger stream (missing, duplicated, early by the
server's clock, late, out of order).

* ``test_bounded_chaos`` (part of ``make test``, fixed seed, about a minute and a half): a script
  of every process, NATS and network fault, overlapping, with a pause longer than the
  duplicate window and a poison job (a hostile spec written between ticks) among them; no
  replica may be lost to anything but a fault's own hand.
* two focused clock tests (also in ``make test``): replicas skewed by +/-2 s report not ready and
  publish nothing while the others fire; wall clocks stepped 30 s either way while running
  never produce an early or duplicate trigger.
* ``test_long_chaos`` (``make chaos SEED=... DURATION=... [SYNC=default] [WARMUP=130]``):
  random schedules of every fault kind from the seed, faults between the NATS servers
  (``routes.py``; ``test_routes.py`` has the bounded scenario) and power loss of NATS nodes
  where FUSE is available (``test_power.py`` has the bounded power scenario), hundreds of
  faults, and a report in ``tests/chaos/reports/``.

Every run audits the job mix of ``jobmix.py``: plain schedules and jobs with a window,
exclusions, a run limit and one-time instants. A failed run keeps its logs (``conftest.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import platform
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from harness import NatsServer, wait_for_async
from harness.ackjournal import find_lost_acks
from harness.chaos import MISSING, ReplicaFleet, now_ms
from harness.clock_files import clockshift_unavailable
from harness.power import SYNC_ALWAYS, PowerCluster, fuse_unavailable
from hrwcron.core.model import Heartbeat, JobSpec
from hrwcron.process.app import Stores, open_stores

from .checker import Verdict, check_stream, failover_table, failover_times
from .faults import (
    ALL_KINDS,
    CHURN,
    GRACEFUL,
    KILL,
    NATS_KILL,
    NATS_LEADER,
    PARTITION,
    PARTITION_MODES,
    PAUSE,
    POISON,
    ROLLING,
    STREAM,
    Maker,
    Schedule,
    Timings,
    World,
    churn,
    clock_file_env,
    counts,
    free_replica,
    graceful_restart,
    hold,
    kill_nats_node,
    kill_replica,
    kill_stream_leader,
    leave_events,
    nats_free,
    partition,
    pause_replica,
    poison_job,
    reap_faketime,
    rolling_upgrade,
    write_clock,
)
from .jobmix import describe
from .power_cuts import POWER_KINDS, make_power_fault
from .routes import ROUTE_KINDS, make_route_fault
from .server_clocks import SERVER_CLOCK, server_clock_maker
from .world import Run, chaos_world, judged, replicas_lost, rode_out, tracebacks_in_full

BOUNDED_SEED = 7
# The chaos scenarios run at the shipped protocol timings, so the defaults are what survives
# them. The duplicate window cannot go below 60 s (a replica refuses a stream whose window is
# shorter than the default job lateness), so the long pauses below outlast it by a real margin.
BOUNDED = Timings(duplicate_window=60.0, max_lateness=15.0)
# Every NATS node losing power at once leaves no majority until all have booted and elected
# leaders again (10-16 s on two shared cores, more under other faults): the lateness window
# must outlast that, or the ticks due meanwhile are missed by design (fail closed).
LONG = Timings(duplicate_window=60.0, max_lateness=30.0)
REPORTS = Path(__file__).resolve().parent / "reports"


@pytest.mark.cluster
@pytest.mark.timeout(240)  # the script's long pause alone outlasts the 60 s duplicate window
async def test_bounded_chaos(tmp_path: Path) -> None:
    rng = random.Random(BOUNDED_SEED)
    async with chaos_world(tmp_path, BOUNDED, faketime=False) as run:
        w, t = run.world, BOUNDED
        schedule = Schedule(w, rng, max_active=3, gap_s=(0.5, 2.0))

        def replica() -> int:
            return free_replica(w, rng)

        def leader_kill() -> object:
            nats_free(w)
            return kill_stream_leader(w, 4.0, STREAM)

        def node_kill() -> object:
            nats_free(w)
            return kill_nats_node(w, rng.randrange(3), 3.0)

        await schedule.script(
            [
                # Longer than the duplicate window: only fencing stops its stale work.
                ("long pause", lambda: pause_replica(w, replica(), t.duplicate_window + 5)),
                ("stall", lambda: partition(w, replica(), "stall", 6.0)),
                ("stream leader", leader_kill),
                ("kill -9", lambda: kill_replica(w, replica(), 4.0)),
                ("drop", lambda: partition(w, replica(), "drop", 5.0)),
                ("churn", lambda: churn(w, rng, 12.0)),
                ("slow", lambda: partition(w, replica(), "slow", 5.0, 0.4)),
                ("half-open", lambda: partition(w, replica(), "half_open", 6.0)),
                ("short pause", lambda: pause_replica(w, replica(), t.member_ttl + 1)),
                ("graceful", lambda: graceful_restart(w, replica())),
                ("NATS node", node_kill),
                # A hostile spec written between ticks; it must not cost a single replica.
                ("poison job", lambda: poison_job(w, rng, 6.0)),
                ("rolling upgrade", lambda: rolling_upgrade(w)),
            ]
        )
        await schedule.finish()
        # Enough ticks that a lost or doubled one would show.
        done = await judged(run, min_ticks=500)
        assert done >= {PAUSE, PARTITION, NATS_LEADER, KILL, CHURN, GRACEFUL, NATS_KILL, ROLLING}
        assert POISON in done
        modes = {f.detail.split()[0] for f in w.faults if f.kind == PARTITION}
        assert modes == set(PARTITION_MODES)


@pytest.mark.cluster
@pytest.mark.timeout(240)
async def test_bounded_chaos_holding_shares(tmp_path: Path) -> None:
    """Replicas holding shares (scheduler.holders = 2) under the faults that move lanes:
    kills, churn (joins and leaves), restarts and a rolling upgrade, some at once."""
    rng = random.Random(BOUNDED_SEED + 1)
    async with chaos_world(tmp_path, BOUNDED, faketime=False, holders=2) as run:
        w = run.world
        schedule = Schedule(w, rng, max_active=3, gap_s=(0.5, 2.0))

        def replica() -> int:
            return free_replica(w, rng)

        def node_kill() -> object:
            nats_free(w)
            return kill_nats_node(w, rng.randrange(3), 3.0)

        await schedule.script(
            [
                ("kill -9", lambda: kill_replica(w, replica(), 4.0)),
                ("churn", lambda: churn(w, rng, 12.0)),
                ("kill -9 while lanes move", lambda: kill_replica(w, replica(), 3.0)),
                ("short pause", lambda: pause_replica(w, replica(), BOUNDED.member_ttl + 1)),
                ("graceful", lambda: graceful_restart(w, replica())),
                ("NATS node", node_kill),
                ("rolling upgrade", lambda: rolling_upgrade(w)),
            ]
        )
        await schedule.finish()
        done = await judged(run, min_ticks=300)
        assert done >= {KILL, CHURN, GRACEFUL, NATS_KILL, ROLLING, PAUSE}


def every_second(count: int) -> list[JobSpec]:
    return [JobSpec(name=f"clk{i:02d}", schedule="@every 1s") for i in range(count)]


@contextlib.asynccontextmanager
async def clock_fleet(
    server: NatsServer, tmp_path: Path, offsets: list[str | None], jobs: list[JobSpec]
) -> AsyncIterator[tuple[ReplicaFleet, Stores, list[Path]]]:
    """Replicas on one server; replica i's wall clock follows a file holding ``offsets[i]``
    (``None``: no faked clock at all)."""
    fleet = ReplicaFleet(server.url, len(offsets), tmp_path / "replicas")
    files = [tmp_path / f"r{i}.faketime" for i in range(len(offsets))]
    stores = await open_stores(fleet.config())
    pids: list[int] = []
    try:
        for job in jobs:
            await stores.jobs.put(job, None)
        for i, offset in enumerate(offsets):
            env: dict[str, str] = {}
            if offset is not None:
                write_clock(files[i], offset)
                env = clock_file_env(files[i])
            pids.append(fleet.start(i, env, wait=False).pid)
        for i in range(len(offsets)):
            await asyncio.to_thread(fleet.wait_started, i)
        yield fleet, stores, files
    finally:
        fleet.stop_all()
        reap_faketime(pids)
        await stores.client.close()


async def heartbeats(stores: Stores) -> dict[str, Heartbeat]:
    return {node: record.heartbeat for node, record in (await stores.members.snapshot()).items()}


async def test_a_replica_with_a_skewed_clock_is_not_ready_and_fires_nothing(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    jobs = every_second(8)
    async with clock_fleet(nats_server, tmp_path, ["+2", "-2", None], jobs) as (
        fleet,
        stores,
        files,
    ):

        async def skewed_not_ready() -> bool:
            beats = await heartbeats(stores)
            return all(
                node in beats and not beats[node].ready and "clock is" in beats[node].reason
                for node in ("r0", "r1")
            )

        await wait_for_async(skewed_not_ready, 30, message="r0 and r1 not ready: clock skew")
        start = now_ms() + 1_000
        await hold(6, "ticks while two of three replicas are skewed")
        verdict = await check_stream(stores.client, jobs, (start, now_ms()))
        in_window = [t for t in verdict.triggers if t.due_ms >= start]
        assert verdict.ok, verdict.table() + fleet.dump_logs()
        assert in_window and {t.node for t in in_window} == {"r2"}

        # Set right while running, r0 becomes ready and takes its share of the jobs.
        write_clock(files[0], 0)
        await wait_for_async(
            lambda: _ready(stores, "r0"), 30, message="r0 ready once its clock is right"
        )
        mark = now_ms() + 2_000
        await hold(4, "ticks with r0 back")
        verdict = await check_stream(stores.client, jobs, (start, now_ms()))
        assert verdict.ok, verdict.table() + fleet.dump_logs()
        assert any(t.node == "r0" and t.due_ms >= mark for t in verdict.triggers)
        assert not any(t.node == "r1" for t in verdict.triggers)


async def next_heartbeat(stores: Stores, node: str) -> None:
    """Return as soon as ``node`` writes its next heartbeat."""
    current = (await stores.members.snapshot()).get(node)
    seen = current.revision if current else 0

    async def watch() -> None:
        async for key, record in stores.members.watch():
            if key == node and record is not None and record.revision > seen:
                return

    await asyncio.wait_for(watch(), 10)


async def _ready(stores: Stores, node: str) -> bool:
    beat = (await heartbeats(stores)).get(node)
    return beat is not None and beat.ready


async def test_a_30s_clock_jump_never_fires_early_or_twice(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    jobs = every_second(16)
    async with clock_fleet(nats_server, tmp_path, ["+0", "+0", "+0"], jobs) as (
        fleet,
        stores,
        files,
    ):
        start = now_ms() + 1_000
        await hold(2, "ticks before the jumps")
        for i, offset in ((0, "+30"), (1, "-30"), (2, "+30")):
            mark = fleet.proc(i).mark()
            # Just after a heartbeat: the longest wait for the next offset measurement, and
            # every job has a tick due in between.
            await next_heartbeat(stores, f"r{i}")
            write_clock(files[i], offset)
            fleet.proc(i).wait_for_log(r"not ready.*clock is \d+ ms off", 20, since=mark)
            await hold(3, f"r{i} 30 s off")
            write_clock(files[i], 0)
            fleet.proc(i).wait_for_log(r"ready: claiming", 20, since=mark)
        end = now_ms()
        verdict = await check_stream(stores.client, jobs, (start, end))
        assert verdict.ok, verdict.table() + fleet.dump_logs()
        assert {t.node for t in verdict.triggers if t.due_ms >= start} == {"r0", "r1", "r2"}


# --- make chaos: long random runs --------------------------------------------------------------


def write_report(
    path: Path,
    *,
    seed: int,
    duration: float,
    run: Run,
    verdict: Verdict,
    elapsed: float,
    errors: list[BaseException],
    power: list[str] | None = None,
    replay: str = "",
) -> None:
    faults = run.world.faults
    failovers = failover_times(verdict.triggers, run.jobs, leave_events(faults))
    quiet = failover_times(verdict.triggers, run.jobs, leave_events(faults, isolated=True))
    restarts = run.world.restarts
    lost = replicas_lost(run.world)
    worst = verdict.worst_lateness_ms
    lines = [
        f"# Chaos run: seed {seed}, {duration:g} s of faults",
        "",
        f"Run on {dt.datetime.now(dt.UTC):%Y-%m-%d} ({platform.machine()}, "
        f"{elapsed / 60:.1f} min wall clock): a 3-node JetStream cluster, "
        f"{run.world.replicas} replicas plus {run.world.spares} spares that come and go, "
        f"{describe(run.jobs)}, max_lateness {LONG.max_lateness:g} s, duplicate_window "
        f"{LONG.duplicate_window:g} s, member_ttl {LONG.member_ttl:g} s, claim_lease "
        f"{LONG.claim_lease:g} s. Replay with "
        f"`make chaos SEED={seed} DURATION={duration:g}{replay}`.",
        "",
        f"**{len(faults)} faults injected, {verdict.ticks} ticks checked, "
        f"{len(verdict.violations)} violations; worst lateness "
        f"{(worst or 0) / 1000:.2f} s; {len(lost)} replicas lost.**",
        "",
        *(f"- replica lost: {entry}" for entry in lost),
        *([""] if lost else []),
        "## Faults",
        "",
        "| fault | count |",
        "|---|---:|",
        *(f"| {kind} | {n} |" for kind, n in counts(faults).items()),
        "",
        "## Ticks",
        "",
        verdict.table(),
        "",
        "## Failover",
        "",
        "How late the first tick after a fault fired, worst over the jobs the faulted replica "
        "had just been firing (fire instant to the server's timestamp). All faults:",
        "",
        failover_table(failovers),
        "",
        "Only faults with no NATS node down within 10 s either side (no election in the way):",
        "",
        failover_table(quiet),
        "",
        *(power or []),
        "## Replica starts retried",
        "",
        f"{len(restarts)} (re)starts exited before the replica joined and were started again, "
        "as a supervisor would." + ("" if not restarts else " Last lines of their output:"),
        "",
        *(f"- {line}" for line in restarts[:20]),
        "",
        f"{rode_out(run.world)} starts rode out an election in-process "
        "(`start-up: JetStream served after N attempts`).",
        "",
        "## Harness errors",
        "",
        f"{len(errors)} faults could not be carried out as planned.",
        *(f"- {type(e).__name__}: {str(e).splitlines()[0][:300]}" for e in errors[:20]),
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines))


@pytest.mark.chaos
@pytest.mark.cluster
@pytest.mark.timeout(0)  # bounded below by the requested duration instead
async def test_long_chaos(
    tmp_path: Path,
    chaos_seed: int,
    chaos_duration: float,
    chaos_sync: str,
    chaos_warmup: float,
    chaos_holders: int,
) -> None:
    rng = random.Random(chaos_seed)
    began = now_ms()
    # Power faults need FUSE; without it the run goes on with every other fault and says so.
    no_power = fuse_unavailable()
    power_sync = None if no_power else chaos_sync
    # Server clock faults need the tracer built; without it the run goes on and says so.
    no_server_clocks = clockshift_unavailable()
    if no_server_clocks:
        print(f"no NATS server clock faults in this run: {no_server_clocks}")
    kinds = (*ALL_KINDS, *ROUTE_KINDS)
    kinds += () if no_server_clocks else (SERVER_CLOCK,)
    kinds += () if no_power else POWER_KINDS
    makers: dict[str, Maker] = dict.fromkeys(ROUTE_KINDS, make_route_fault)
    if not no_power:
        makers |= dict.fromkeys(POWER_KINDS, make_power_fault)

    async def scenario() -> None:
        span = chaos_duration + chaos_warmup
        async with chaos_world(
            tmp_path,
            LONG,
            faketime=True,
            power_sync=power_sync,
            span_s=span,
            route_links=True,
            holders=chaos_holders,
            server_clocks=not no_server_clocks,
        ) as run:
            schedule = Schedule(run.world, rng, kinds, max_active=4, gap_s=(0.3, 3.0))
            schedule.makers = makers | {SERVER_CLOCK: server_clock_maker(run.client)}
            if chaos_warmup > 0:
                await hold(chaos_warmup, "work before the first fault")
            await schedule.tour()  # every kind at least once, whatever the duration
            left = chaos_duration + chaos_warmup - (now_ms() - run.start_ms) / 1000
            await schedule.run_for(left)
            await schedule.finish(raise_errors=False)
            verdict = await run.verdict(now_ms() - 1_000)
            suffix = "" if chaos_sync == SYNC_ALWAYS else f"-sync-{chaos_sync}"
            suffix += f"-warmup{chaos_warmup:g}s" if chaos_warmup else ""
            suffix += f"-holders{chaos_holders}" if chaos_holders else ""
            replay = ("" if chaos_sync == SYNC_ALWAYS else f" SYNC={chaos_sync}") + (
                f" WARMUP={chaos_warmup:g}" if chaos_warmup else ""
            )
            replay += f" HOLDERS={chaos_holders}" if chaos_holders else ""
            name = f"chaos-seed{chaos_seed}-{chaos_duration:g}s{suffix}.md"
            write_report(
                REPORTS / name,
                seed=chaos_seed,
                duration=chaos_duration,
                run=run,
                verdict=verdict,
                elapsed=(now_ms() - began) / 1000,
                errors=schedule.errors,
                power=power_report(run.world, chaos_sync, no_power, verdict),
                replay=replay,
            )
            print((REPORTS / name).read_text())
            assert verdict.ok, run.explain(verdict)
            assert not schedule.errors, schedule.errors
            lost = replicas_lost(run.world)
            assert not lost, "\n".join(lost) + "\n\n" + tracebacks_in_full(run.world)

    await asyncio.wait_for(scenario(), chaos_warmup + chaos_duration + 1_200)


def power_report(
    world: World, sync: str, unavailable: str | None, verdict: Verdict | None = None
) -> list[str]:
    """The report's section on power faults: the setting, the cuts, the acks checked, and
    where the losses fell (acknowledged triggers lost, by the next power cut after their
    acknowledgement; missing ticks, as ranges of due instants)."""
    if unavailable is not None:
        return ["## Power loss", "", f"No power faults in this run: {unavailable}.", ""]
    cluster = world.cluster
    assert isinstance(cluster, PowerCluster)
    dropped = sum(c.bytes for c in cluster.cuts)
    acks = world.acks()
    if verdict is not None:
        # The replicas go on acknowledging after the verdict read the stream: only ticks the
        # verdict settled can be held to it.
        acks = [a for a in acks if _due_of(a.msg_id) <= verdict.window[1]]
    lines = [
        "## Power loss",
        "",
        f"nats-server `sync_interval`: **{sync}**. {len(cluster.cuts)} node power cuts "
        f"dropped {dropped / 1024:.0f} KiB of unsynced writes in all. "
        f"{len({a.msg_id for a in acks})} triggers acknowledged to the replicas "
        f"({len(acks)} PubAcks) were held to their stream sequence (check `ack_lost`). "
        "The replay command above names the warm-up before the first fault, if there was one.",
        "",
    ]
    if verdict is None:
        return lines
    cuts = sorted((f for f in world.faults if f.kind in POWER_KINDS), key=lambda f: f.start_ms)
    lost = find_lost_acks(acks, [(t.seq, t.msg_id) for t in verdict.triggers])
    by_cut: dict[int, int] = {}
    for item in lost:
        after = [i for i, f in enumerate(cuts) if f.start_ms >= item.ack.at_ms]
        by_cut[after[0] if after else -1] = by_cut.get(after[0] if after else -1, 0) + 1
    lines += [
        "| power fault | at | acknowledged triggers lost (acknowledged since the previous one) |",
        "|---|---|---:|",
        *(
            f"| {f.kind} ({f.target}) | {_clock(f.start_ms)} | {by_cut.get(i, 0)} |"
            for i, f in enumerate(cuts)
        ),
        f"| (none after) | | {by_cut.get(-1, 0)} |",
        "",
    ]
    missing = sorted({v.due_ms for v in verdict.violations if v.kind == MISSING})
    if missing:
        ranges: list[list[int]] = []
        for due in missing:
            if ranges and due - ranges[-1][1] <= 3_000:
                ranges[-1][1] = due
                ranges[-1][2] += 1
            else:
                ranges.append([due, due, 1])
        lines += [
            "Missing ticks by due instant (instants with at least one job missing):",
            "",
            *(f"- {_clock(a)} .. {_clock(b)}: {n} instants" for a, b, n in ranges[:30]),
            "",
        ]
    return lines


def _due_of(msg_id: str) -> float:
    due = msg_id.rpartition(":")[2]
    return float(due) if due.isdigit() else float("inf")


def _clock(ms: float) -> str:
    return f"{dt.datetime.fromtimestamp(ms / 1000):%T}"
