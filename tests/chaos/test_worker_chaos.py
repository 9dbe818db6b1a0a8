"""Chaos for the worker SDK: worker processes killed with SIGKILL (some right between a
handler's return and its done record), paused with SIGSTOP, cut off from NATS and slowed by a
TCP proxy, and stopped gracefully while their handlers run, against a real nats-server.

Triggers are published straight into the trigger stream, as replicas publish them, at a steady
rate; every handler appends its start and end to a shared run log. At the end the log is
audited against what was published: every tick ran to its end at least once, and every second
start of a tick's handler is one the SDK documents and counts (a takeover, flagged to the
handler as ``trigger.takeover``, or a retry after a graceful stop cancelled the run).

* ``test_bounded_worker_chaos`` (``make test``, fixed seed, well under a minute): a script of
  every fault once, overlapping.
* ``test_long_worker_chaos`` (``make chaos``, ``--chaos-duration``, ``--chaos-seed``): random
  faults for the whole duration and a report in ``tests/chaos/reports/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
import platform
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.errors import Error as NatsError

from harness import NatsServer, ReplicaProcess, TcpProxy, wait_for_async
from harness.workers import RunAudit, audit_runs, read_runs, worker_process
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.core.model import TriggerMessage, encode
from hrwcron.engine.failpoints import ENV as FAILPOINTS
from hrwcron.process.app import open_stores

from .faults import hold

DURABLE = "chaos"
JOBS = [f"wchaos.j{i}" for i in range(4)]
TICK_EVERY = 0.25  # seconds between two ticks of one job
ACK_WAIT = 2.0
HEARTBEAT = 0.4  # so the lease is max(ACK_WAIT, 3 heartbeats) = 2 s
WORKERS = 3
BOUNDED_SEED = 11
REPORTS = Path(__file__).resolve().parent / "reports"

KILL = "kill -9"
CRASH_AFTER_HANDLER = "kill -9 after handler"
PAUSE = "pause"
LONG_PAUSE = "long pause"
STALL = "partition (stall)"
DROP = "partition (drop)"
SLOW = "slow replies"
GRACEFUL = "graceful stop"
KINDS = (KILL, CRASH_AFTER_HANDLER, PAUSE, LONG_PAUSE, STALL, DROP, SLOW, GRACEFUL)


@dataclass
class Fault:
    kind: str
    worker: str
    seconds: float
    start: float = field(default_factory=time.time)

    def __str__(self) -> str:
        return f"{self.kind} {self.worker} {self.seconds:.1f}s"


class Fleet:
    """Worker processes, each connected through its own proxy, restarted like a supervisor."""

    def __init__(self, server: NatsServer, base: Path) -> None:
        self.server = server
        self.base = base
        self.runs = base / "runs.jsonl"
        self.names = [f"w{i}" for i in range(WORKERS)]
        self.proxies = {name: TcpProxy.to(server) for name in self.names}
        self.procs: dict[str, ReplicaProcess] = {}
        self.busy: set[str] = set()  # workers with a fault in progress
        self.faults: list[Fault] = []

    def options(self, name: str) -> list[str]:
        # Half the workers refuse writes while disconnected, half buffer them (nats-py's
        # default): a buffered write that lands late must not double a run either.
        extra = ["--no-buffer"] if int(name[1:]) % 2 else []
        return [
            "--durable", DURABLE, "--subjects", "hrwcron.trigger.wchaos.>",
            "--ack-wait", str(ACK_WAIT), "--heartbeat", str(HEARTBEAT),
            "--stop-timeout", "0.3", "--concurrency", "4", *extra,
        ]  # fmt: skip

    def start(self, name: str, failpoints: str = "") -> None:
        proc = self.procs.get(name)
        if proc is None:
            proc = worker_process(
                self.proxies[name].url,
                self.runs,
                name,
                log_path=self.base / f"{name}.log",
                options=self.options(name),
                start=False,
            )
            self.procs[name] = proc
        proc.env[FAILPOINTS] = failpoints
        proc.start()  # output() and wait_for_log see this incarnation only
        proc.wait_for_log(f"worker {name} ready", 30)

    def restart(self, name: str, failpoints: str = "") -> None:
        proc = self.procs[name]
        if proc.running:
            proc.kill()
        self.start(name, failpoints)

    def free(self, rng: random.Random) -> str | None:
        idle = [n for n in self.names if n not in self.busy]
        return rng.choice(idle) if idle else None

    def heal(self) -> None:
        for name in self.names:
            self.proxies[name].passthrough()
            proc = self.procs[name]
            if proc.running:
                proc.resume()
            else:
                self.restart(name)

    def close(self) -> None:
        for proc in self.procs.values():
            with contextlib.suppress(Exception):
                proc.resume()
                proc.terminate(timeout=10)
        for proxy in self.proxies.values():
            proxy.close()

    def dump_logs(self, lines: int = 40) -> str:
        return "\n".join(
            f"----- {name} -----\n" + "\n".join(proc.output().splitlines()[-lines:])
            for name, proc in self.procs.items()
        )


async def _thread(fn: Callable[..., object], *args: object) -> None:
    await asyncio.to_thread(fn, *args)


def fault_step(fleet: Fleet, rng: random.Random, kind: str) -> Awaitable[None] | None:
    """A coroutine that applies ``kind`` to a free worker and heals it; None if none is free."""
    name = fleet.free(rng)
    if name is None:
        return None
    proxy, proc = fleet.proxies[name], fleet.procs[name]
    seconds = {
        KILL: rng.uniform(0.5, 3.0),
        CRASH_AFTER_HANDLER: rng.uniform(0.5, 2.0),
        PAUSE: rng.uniform(0.3, ACK_WAIT),  # shorter than ack_wait: nothing redelivered
        LONG_PAUSE: rng.uniform(5.0, 10.0),  # past ack_wait and the lease: taken over
        STALL: rng.uniform(1.0, 8.0),
        DROP: rng.uniform(1.0, 6.0),
        SLOW: rng.uniform(2.0, 5.0),
        GRACEFUL: rng.uniform(0.2, 1.0),
    }[kind]
    fault = Fault(kind, name, seconds)
    fleet.busy.add(name)
    fleet.faults.append(fault)

    async def apply() -> None:
        try:
            if kind in (KILL, CRASH_AFTER_HANDLER):
                if kind == CRASH_AFTER_HANDLER:
                    # Dies on its next successful run, after the handler and before the done
                    # record: the one window in which a tick's handler runs twice.
                    await _thread(fleet.restart, name, "worker_handler_returned=crash")
                    await wait_for_async(lambda: not proc.running, timeout=30, message="crash")
                else:
                    proc.kill()
                await hold(seconds, f"{name} down")
                await _thread(fleet.start, name)
            elif kind in (PAUSE, LONG_PAUSE):
                proc.pause()
                await hold(seconds, f"{name} paused")
                proc.resume()
            elif kind in (STALL, DROP, SLOW):
                mode = {STALL: "stall", DROP: "drop", SLOW: "slow"}[kind]
                await _thread(proxy.set_mode, mode, 0.3 if kind == SLOW else 0.0)
                await hold(seconds, f"{name} {mode}")
                await _thread(proxy.passthrough)
            else:
                await _thread(proc.terminate, 30.0)  # SIGTERM: stop() cancels after 0.3 s
                await hold(seconds, f"{name} stopped")
                await _thread(fleet.start, name)
        finally:
            fleet.busy.discard(name)

    return apply()


class Publisher:
    """Ticks of every job at a steady rate, straight into the stream, as replicas publish."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.published: list[str] = []
        self.failed = 0

    async def run(self, stop: asyncio.Event) -> None:
        js = self.client.jetstream()
        base = int(time.time() * 1000)
        for n in itertools.count():
            if stop.is_set():
                return
            due = base + int(n * TICK_EVERY * 1000)
            for job in JOBS:
                tick = f"{job}:{due}"
                body = TriggerMessage(
                    job=job, tick=tick, due="", due_ms=due, fired_at="", node="chaos",
                    attempt=1, payload={},
                )  # fmt: skip
                try:
                    await js.publish(
                        f"hrwcron.trigger.{job}", encode(body), headers={"Nats-Msg-Id": tick}
                    )
                except (NatsError, TimeoutError):
                    self.failed += 1  # never stored, so never expected
                else:
                    self.published.append(tick)
            await hold(max(0.0, (due + TICK_EVERY * 1000) / 1000 - time.time()), "next tick")


@dataclass
class Outcome:
    audit: RunAudit
    fleet: Fleet
    publisher: Publisher
    elapsed: float

    def explain(self) -> str:
        faults = "\n".join(
            f"{dt.datetime.fromtimestamp(f.start):%T} {f}" for f in self.fleet.faults
        )
        samples = "\n".join(self.audit.unexplained[:20] + self.audit.unhandled[:20])
        return f"{self.audit.table()}\n{samples}\n\nfaults:\n{faults}\n\n{self.fleet.dump_logs()}"


@contextlib.asynccontextmanager
async def worker_world(server: NatsServer, base: Path) -> AsyncIterator[tuple[Fleet, Client]]:
    config = Config(
        nats=NatsConfig(servers=[server.url]),
        scheduler=SchedulerConfig(node_id="provisioner"),
        http=HttpConfig(listen=""),
    )
    stores = await open_stores(config)  # the stream and buckets, as replicas create them
    await stores.client.close()
    client = await nats.connect(server.url)
    fleet = Fleet(server, base)
    try:
        for name in fleet.names:
            await _thread(fleet.start, name)
        yield fleet, client
    finally:
        await _thread(fleet.close)
        await client.close()


async def run_chaos(
    server: NatsServer,
    base: Path,
    drive: Callable[[Fleet], Awaitable[None]],
) -> Outcome:
    began = time.time()
    async with worker_world(server, base) as (fleet, client):
        publisher = Publisher(client)
        stop = asyncio.Event()
        publishing = asyncio.create_task(publisher.run(stop))
        try:
            await drive(fleet)
        finally:
            stop.set()
            await publishing
        await _thread(fleet.heal)

        def audit() -> RunAudit:
            return audit_runs(publisher.published, read_runs(fleet.runs))

        with contextlib.suppress(AssertionError):
            await wait_for_async(
                lambda: not audit().unhandled, timeout=120, interval=0.5, message="all handled"
            )
        with contextlib.suppress(AssertionError):
            await wait_for_async(lambda: _settled(client), timeout=60, interval=0.5)
        return Outcome(audit(), fleet, publisher, time.time() - began)


async def _settled(client: Client) -> bool:
    info = await client.jetstream().consumer_info("HRWCRON_TRIGGERS", DURABLE)
    return info.num_ack_pending == 0 and info.num_pending == 0


async def scripted(fleet: Fleet, rng: random.Random) -> None:
    """Every fault kind once, overlapping two at a time, then a few seconds of calm."""
    running: set[asyncio.Task[None]] = set()
    for kind in KINDS:
        while True:
            running = {t for t in running if not t.done()}
            # Three workers, at most two faults: a free worker exists whenever there is room.
            step = fault_step(fleet, rng, kind) if len(running) < 2 else None
            if step is not None:
                break
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
        running.add(asyncio.ensure_future(step))
        await hold(rng.uniform(0.5, 1.5), "gap between faults")
    await asyncio.gather(*running)
    await hold(2.0, "calm before the audit")


async def random_faults(fleet: Fleet, rng: random.Random, duration: float) -> None:
    weights = {
        KILL: 3,
        CRASH_AFTER_HANDLER: 2,
        PAUSE: 2,
        LONG_PAUSE: 2,
        STALL: 2,
        DROP: 2,
        SLOW: 1,
        GRACEFUL: 2,
    }
    kinds, odds = list(weights), list(weights.values())
    end = time.time() + duration
    running: set[asyncio.Task[None]] = set()
    while time.time() < end:
        running = {t for t in running if not t.done()}
        if len(running) < 2:
            step = fault_step(fleet, rng, rng.choices(kinds, odds)[0])
            if step is not None:
                running.add(asyncio.ensure_future(step))
        await hold(rng.uniform(0.3, 2.0), "gap between faults")
    await asyncio.gather(*running)
    await hold(2.0, "calm before the audit")


def summary(outcome: Outcome) -> str:
    kinds = Counter(f.kind for f in outcome.fleet.faults)
    return "\n".join(
        [
            outcome.audit.table(),
            "",
            "| fault | count |",
            "|---|---:|",
            *(f"| {kind} | {kinds[kind]} |" for kind in KINDS),
        ]
    )


async def test_bounded_worker_chaos(nats_server: NatsServer, tmp_path: Path) -> None:
    rng = random.Random(BOUNDED_SEED)
    outcome = await run_chaos(nats_server, tmp_path, lambda fleet: scripted(fleet, rng))
    print(summary(outcome))
    assert outcome.audit.ok, outcome.explain()
    assert {f.kind for f in outcome.fleet.faults} == set(KINDS)
    # The documented windows were really exercised: runs were taken over and some ran twice.
    assert outcome.audit.takeovers >= 1, outcome.explain()
    assert outcome.audit.published > 200  # enough ticks that a lost or doubled one shows


@pytest.mark.chaos
@pytest.mark.timeout(0)  # bounded by the requested duration instead
async def test_long_worker_chaos(
    nats_server: NatsServer, tmp_path: Path, chaos_seed: int, chaos_duration: float
) -> None:
    rng = random.Random(chaos_seed)
    outcome = await asyncio.wait_for(
        run_chaos(nats_server, tmp_path, lambda fleet: random_faults(fleet, rng, chaos_duration)),
        chaos_duration + 600,
    )
    name = f"worker-chaos-seed{chaos_seed}-{chaos_duration:g}s.md"
    lines = [
        f"# Worker chaos run: seed {chaos_seed}, {chaos_duration:g} s of faults",
        "",
        f"Run on {dt.datetime.now(dt.UTC):%Y-%m-%d} ({platform.machine()}, "
        f"{outcome.elapsed / 60:.1f} min wall clock): one nats-server, {WORKERS} worker "
        f"processes (concurrency 4, ack_wait {ACK_WAIT:g} s, heartbeat {HEARTBEAT:g} s, "
        f"lease {max(ACK_WAIT, 3 * HEARTBEAT):g} s) each behind its own TCP proxy, "
        f"{len(JOBS)} jobs with a tick every {TICK_EVERY:g} s, handlers of 0.05-0.6 s. "
        f"Replay with `make chaos SEED={chaos_seed} DURATION={chaos_duration:g}`.",
        "",
        f"**{len(outcome.fleet.faults)} faults, {outcome.audit.published} ticks, "
        f"{len(outcome.audit.unhandled)} unhandled, {len(outcome.audit.unexplained)} "
        f"unexplained second runs.**",
        "",
        summary(outcome),
        "",
    ]
    REPORTS.mkdir(parents=True, exist_ok=True)
    (REPORTS / name).write_text("\n".join(lines))
    print("\n".join(lines))
    assert outcome.audit.ok, outcome.explain()
