"""Faults for chaos runs: each one a coroutine over a :class:`World`, combinable into random
schedules drawn from a seed.

A world is a 3-node JetStream cluster, core replicas that are always meant to be there, spare
replicas that only come and go (membership churn), a TCP proxy between every replica and every
NATS node (to cut one replica off), and a libfaketime clock file per replica (to skew or step its
wall clock while it runs). Every fault records what it did and when, so a report can say what was
injected and how long failover took.

Faults respect two limits, because the invariants only promise something while they hold: a
majority of NATS nodes stays up (one node down at a time), and at least one core replica is
unharmed at every moment ("none lost while at least one replica can reach NATS"). Everything else
overlaps freely: a replica may be paused while a NATS node restarts and another one is cut off.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import nats

from harness import NatsCluster, TcpProxy, find_libfaketime, wait_for_async
from harness.ackjournal import ACK_JOURNAL_ENV, Ack, read_journals
from harness.ackjournal import script_path as ackjournal_script
from harness.chaos import ReplicaFleet, now_ms, wait_until_ms
from harness.clock_files import write_clock
from harness.timings import SHIPPED
from harness.timings import Timings as ProtocolTimings

T = TypeVar("T")

# Fault kinds, as they appear in reports.
KILL = "kill -9 + restart"
PAUSE = "SIGSTOP/SIGCONT"
GRACEFUL = "graceful restart"
ROLLING = "rolling upgrade"
NATS_KILL = "NATS node kill -9 + restart"
NATS_LEADER = "NATS stream leader kill -9 + restart"
PARTITION = "partition"  # detail says drop, stall, slow or half_open
SKEW = "clock skew +/-2 s"
JUMP = "clock jump 30 s"
CHURN = "membership churn"
POISON = "poison job"  # detail says which spec, and whether through the bucket or the API
SERVER_CLOCK = "NATS server clock"  # made in server_clocks.py; not in ALL_KINDS
ALL_KINDS = (
    KILL,
    PAUSE,
    GRACEFUL,
    ROLLING,
    NATS_KILL,
    NATS_LEADER,
    PARTITION,
    SKEW,
    JUMP,
    CHURN,
    POISON,
)
# How often a random schedule picks each kind. Faults on one replica wait for a free target
# more often than the others (one core replica must stay unharmed), so they are drawn more.
WEIGHTS = {KILL: 3, PAUSE: 3, PARTITION: 4, GRACEFUL: 1, ROLLING: 1, NATS_KILL: 1}
WEIGHTS |= {NATS_LEADER: 1, SKEW: 2, JUMP: 2, CHURN: 1, POISON: 1}
# What a poison job fault holds: the jobs bucket (one hostile spec at a time).
JOBS_TARGET = "jobs"
PARTITION_MODES = ("drop", "stall", "slow", "half_open")
# Faults that take a replica away from the work, for failover figures.
TAKES_A_REPLICA = frozenset({KILL, PAUSE, GRACEFUL, ROLLING, PARTITION, SKEW, JUMP, CHURN})

# A replica checks its clock against one other, the members leader's: both wrong by the same
# amount at once is the stated limit of "never early" (docs/reliability.md), not a fault the
# checker could pass. So a replica's clock and a server's are never wrong at the same time.
REPLICA_CLOCKS = frozenset({SKEW, JUMP})

STREAM = "HRWCRON_TRIGGERS"
CLAIMS_STREAM = "KV_hrwcron_claims"


def clock_file_env(path: Path) -> dict[str, str]:
    """Environment that puts a replica's wall clock under ``path``'s offset (``+0``, ``-2``,
    ``+30``), so a test can set the clock of a running replica. Only the wall clock moves, as
    with a bad NTP step; monotonic time stays true.

    The file is read on every clock reading: with libfaketime's cache the new offset would
    only appear when the cache expires, which a replica's once-a-second heartbeat always
    triggers first, and a step would never land between two heartbeats, where it hurts."""
    return {
        "LD_PRELOAD": find_libfaketime(),
        "FAKETIME_TIMESTAMP_FILE": str(path),
        "FAKETIME_NO_CACHE": "1",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def reap_faketime(pids: Iterable[int]) -> None:
    """libfaketime leaves a shared-memory segment and a semaphore behind for each process that
    loaded it; remove those of these exited processes."""
    for pid in pids:
        for name in (f"faketime_shm_{pid}", f"sem.faketime_sem_{pid}"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"/dev/shm/{name}")


@dataclass
class Timings:
    """The replicas' timings, which fault durations are scaled by: the protocol's (shipped,
    unless a scenario says otherwise) and the trigger stream's."""

    protocol: ProtocolTimings = SHIPPED
    duplicate_window: float = 60.0
    max_lateness: float = 15.0

    @property
    def member_ttl(self) -> float:
        return self.protocol.member_ttl

    @property
    def claim_lease(self) -> float:
        return self.protocol.claim_lease

    def env(self) -> dict[str, str]:
        return {
            **self.protocol.env(),
            "HRWCRON_SCHEDULER_DUPLICATE_WINDOW": f"{self.duplicate_window:g}s",
        }


@dataclass
class Fault:
    kind: str
    target: str  # a replica (r0..) or a NATS node (n0..)
    start_ms: float
    end_ms: float = 0.0
    detail: str = ""

    @property
    def seconds(self) -> float:
        return max(0.0, (self.end_ms or now_ms()) - self.start_ms) / 1000

    def __str__(self) -> str:
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.kind} {self.target}{detail} for {self.seconds:.1f} s"


class Unavailable(Exception):
    """No target can take this fault right now without breaking the world's limits."""


@dataclass
class World:
    """The system under test and the bookkeeping of the faults on it."""

    cluster: NatsCluster
    base_dir: Path
    timings: Timings = field(default_factory=Timings)
    replicas: int = 3
    spares: int = 2
    faketime: bool = True
    settle_s: float = 2.0  # a healed target stays reserved this long, to rejoin
    faults: list[Fault] = field(default_factory=list)
    # Replicas record every PubAck of a trigger (harness/ackjournal.py), for the lost-ack check.
    ack_journal: bool = False
    # scheduler.holders of every replica (0: each holds every job).
    holders: int = 0

    def __post_init__(self) -> None:
        env = {
            "HRWCRON_SCHEDULER_REPLICAS": "3",
            "HRWCRON_SCHEDULER_HOLDERS": str(self.holders),
            **self.timings.env(),
        }
        count, logs = self.replicas + self.spares, self.base_dir / "replicas"
        if self.ack_journal:
            self.fleet = ReplicaFleet(
                self.cluster.url,
                count,
                logs,
                env=env,
                module=None,
                args=[ackjournal_script(), "run"],
                timings=self.timings.protocol,
            )
        else:
            self.fleet = ReplicaFleet(
                self.cluster.url, count, logs, env=env, timings=self.timings.protocol
            )
        self.proxies: list[list[TcpProxy]] = []
        self.clock_files = [self.base_dir / f"{node}.faketime" for node in self.fleet.nodes]
        self.busy: dict[str, str] = {}  # target -> the kind of fault holding it
        self.walking: set[str] = set()  # kinds that walk over several targets, under way
        self.restarts: list[str] = []  # starts that failed and were retried, with the reason
        self._faketime_pids: set[int] = set()

    # --- set-up and tear-down -------------------------------------------------------------

    @property
    def core(self) -> list[int]:
        return list(range(self.replicas))

    @property
    def spare_indices(self) -> list[int]:
        return list(range(self.replicas, self.replicas + self.spares))

    def node(self, i: int) -> str:
        return self.fleet.nodes[i]

    def replica_env(self, i: int) -> dict[str, str]:
        env = {"HRWCRON_NATS_URL": ",".join(p.url for p in self.proxies[i])}
        if self.faketime:
            env.update(clock_file_env(self.clock_files[i]))
        if self.ack_journal:
            env[ACK_JOURNAL_ENV] = str(self.ack_journal_path(i))
        return env

    def ack_journal_path(self, i: int) -> Path:
        return self.base_dir / "replicas" / f"{self.node(i)}.acks.jsonl"

    def acks(self) -> list[Ack]:
        """Every trigger PubAck the replicas recorded (empty without ``ack_journal``)."""
        if not self.ack_journal:
            return []
        return read_journals(self.ack_journal_path(i) for i in range(len(self.fleet.nodes)))

    def start(self, timeout: float = 90.0) -> None:
        """Proxies for every replica, then the core replicas; returns once all have joined."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        for i in range(self.replicas + self.spares):
            self.proxies.append([TcpProxy(s.port).start() for s in self.cluster.servers])
            write_clock(self.clock_files[i], 0)
        for i in self.core:
            self._start(i, wait=False)
        for i in self.core:
            self.fleet.wait_started(i, timeout)

    def _start(self, i: int, *, wait: bool = True, give_up_s: float = 300.0) -> None:
        """Start replica ``i`` like a supervisor would: a start that exits before the replica
        joined (a JetStream request timing out during a NATS leader election, say) is
        counted in ``restarts`` and tried again, for up to ``give_up_s``."""
        deadline = time.monotonic() + give_up_s
        while True:
            proc = self.fleet.start(i, self.replica_env(i), wait=False)
            if self.faketime:
                self._faketime_pids.add(proc.pid)
            if not wait:
                return
            try:
                self.fleet.wait_started(i, 90.0)
                return
            except AssertionError as exc:
                if proc.running or time.monotonic() > deadline:
                    raise
                self.restarts.append(f"{self.node(i)}: {_last_line(str(exc))}")
                self._reap()

    def _reap(self) -> None:
        """libfaketime leaves a shared-memory segment per process that does not exit cleanly."""
        running = {self.fleet.proc(i).pid for i in self.fleet.running()}
        exited = self._faketime_pids - running
        reap_faketime(exited)
        self._faketime_pids -= exited

    def close(self) -> None:
        self.fleet.stop_all()
        for proxies in self.proxies:
            for proxy in proxies:
                proxy.close()
        self._reap()

    async def heal(self) -> None:
        """Undo whatever a fault left behind: every proxy passes, every clock is true, every
        core replica and NATS node runs, no spare does."""
        if self.cluster.links is not None:
            self.cluster.links.heal()
        for i, proxies in enumerate(self.proxies):
            write_clock(self.clock_files[i], 0)
            for proxy in proxies:
                if proxy.mode != "pass":
                    await asyncio.to_thread(proxy.passthrough)
        for j, server in enumerate(self.cluster.servers):
            if not server.running:
                await asyncio.to_thread(self.cluster.restart, j)
        for i in range(self.replicas + self.spares):
            proc = self.fleet.procs[i]
            if proc is not None and proc.running:
                proc.resume()
                if i not in self.core:
                    await asyncio.to_thread(self.fleet.kill, i)
            elif i in self.core:
                await asyncio.to_thread(self._start, i)
        self._reap()

    # --- bookkeeping ----------------------------------------------------------------------

    def healthy_core(self) -> list[int]:
        return [i for i in self.core if self.node(i) not in self.busy and i in self.fleet.running()]

    def can_take(self, target: str) -> bool:
        if target in self.busy:
            return False
        if target.startswith("n"):
            return not any(t.startswith("n") for t in self.busy)
        if target not in self.fleet.nodes:
            return True  # the jobs bucket: harms no replica or node by itself
        index = self.fleet.nodes.index(target)
        if index not in self.core:
            return True
        others = [i for i in self.healthy_core() if self.node(i) != target]
        return index in self.fleet.running() and len(others) >= 1

    @contextlib.asynccontextmanager
    async def holding(self, kind: str, target: str, detail: str = "") -> AsyncIterator[Fault]:
        """Reserve ``target`` for a fault, record it, and keep it reserved a little after it
        heals so the next fault does not find it half way back."""
        if not self.can_take(target):
            raise Unavailable(f"{target} cannot take {kind} now")
        self.busy[target] = kind
        fault = Fault(kind, target, now_ms(), detail=detail)
        self.faults.append(fault)
        try:
            yield fault
        finally:
            fault.end_ms = now_ms()
            try:
                await hold(self.settle_s, f"{target} settling after {kind}")
            finally:
                self.busy.pop(target, None)

    async def acquire(self, kind: str, target: str, timeout: float = 600.0) -> None:
        """Wait until ``target`` may take ``kind`` (for faults that walk over every replica)."""
        await wait_for_async(
            lambda: self.can_take(target),
            timeout=timeout,
            interval=0.2,
            message=f"{target} free for {kind}",
        )


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""


async def hold(seconds: float, what: str) -> None:
    """Let a fault last ``seconds``: the passing of time is the fault here, not a wait on a
    state."""
    await wait_until_ms(now_ms() + seconds * 1000, what=what)


def _run(fn: Callable[..., T], *args: Any) -> Awaitable[T]:
    return asyncio.to_thread(fn, *args)


# --- the faults ---------------------------------------------------------------------------------


async def kill_replica(world: World, i: int, down_s: float) -> Fault:
    """SIGKILL (no shutdown, claims left behind), then start it again after ``down_s``."""
    async with world.holding(KILL, world.node(i), f"down {down_s:.1f} s") as fault:
        await _run(world.fleet.kill, i)
        world._reap()
        await hold(down_s, f"{world.node(i)} down")
        await _run(world._start, i)
    return fault


async def pause_replica(world: World, i: int, pause_s: float) -> Fault:
    """SIGSTOP for ``pause_s`` (a GC pause or a frozen VM), then SIGCONT: the replica wakes up
    with whatever it was doing half done, its heartbeat expired and its claims taken over."""
    async with world.holding(PAUSE, world.node(i), f"{pause_s:.1f} s") as fault:
        world.fleet.pause(i)
        try:
            await hold(pause_s, f"{world.node(i)} paused")
        finally:
            world.fleet.resume(i)
    return fault


async def graceful_restart(world: World, i: int) -> Fault:
    """SIGTERM (finish in-flight publishes, leave the membership), then start again."""
    async with world.holding(GRACEFUL, world.node(i)) as fault:
        code = await _run(world.fleet.terminate, i)
        fault.detail = f"exit {code}"
        world._reap()
        await _run(world._start, i)
    return fault


async def rolling_upgrade(world: World) -> list[Fault]:
    """Gracefully restart every core replica in turn, each once it is free to go."""
    steps: list[Fault] = []
    world.walking.add(ROLLING)
    try:
        for i in world.core:
            await world.acquire(ROLLING, world.node(i))
            async with world.holding(ROLLING, world.node(i), f"step {i + 1}") as fault:
                await _run(world.fleet.terminate, i)
                world._reap()
                await _run(world._start, i)
            steps.append(fault)
    finally:
        world.walking.discard(ROLLING)
    return steps


def streams_current(cluster: NatsCluster) -> bool:
    """Every stream has a leader, and in that leader's own view (followers do not track one
    another) all its replicas are current."""
    leaders: dict[str, str] = {}
    confirmed: set[str] = set()
    for i in cluster.running():
        try:
            view = cluster.servers[i].jsz(accounts=True, streams=True)
        except Exception:
            return False
        for account in view.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                info = stream.get("cluster") or {}
                leader = info.get("leader") or ""
                if not leader:
                    return False
                leaders[stream["name"]] = leader
                replicas = info.get("replicas") or []
                if leader == cluster.names[i] and all(r.get("current") for r in replicas):
                    confirmed.add(stream["name"])
    return bool(leaders) and set(leaders) == confirmed


async def kill_nats_node(world: World, j: int, down_s: float, *, kind: str = NATS_KILL) -> Fault:
    """SIGKILL NATS node ``j`` (replicas connected to it fail over to the others), restart it
    after ``down_s`` on the same ports and store, and wait until every stream's replicas are
    current again: a node that is up but still catching up does not count towards the majority
    the next NATS fault must leave standing."""
    name = world.cluster.names[j]
    async with world.holding(kind, name, f"down {down_s:.1f} s") as fault:
        await _run(world.cluster.kill, j)
        await hold(down_s, f"{name} down")
        await _run(world.cluster.restart, j)
        await wait_for_async(
            lambda: _run(streams_current, world.cluster),
            timeout=120,
            interval=0.5,
            message=f"every stream current after {name} restarted",
        )
    return fault


async def kill_stream_leader(world: World, down_s: float, stream: str = STREAM) -> Fault:
    """Kill whichever node leads ``stream`` now: an election happens under the replicas."""
    leader = await _run(world.cluster.wait_stream_leader, stream)
    fault = await kill_nats_node(world, leader, down_s, kind=NATS_LEADER)
    fault.detail = f"{stream}, {fault.detail}"
    return fault


async def partition(world: World, i: int, mode: str, seconds: float, delay_s: float = 0.5) -> Fault:
    """Cut replica ``i`` off from every NATS node through its proxies: ``drop`` (resets, refused
    reconnects), ``stall`` (a black hole that delivers the held bytes when it heals),
    ``slow`` (``delay_s`` per chunk each way), ``half_open`` (its writes arrive, no answer does)."""
    detail = f"{mode} {seconds:.1f} s" + (f", {delay_s:.2f} s per chunk" if mode == "slow" else "")
    async with world.holding(PARTITION, world.node(i), detail) as fault:
        for proxy in world.proxies[i]:
            await _run(proxy.set_mode, mode, delay_s if mode == "slow" else 0.0)
        try:
            await hold(seconds, f"{world.node(i)} partitioned ({mode})")
        finally:
            for proxy in world.proxies[i]:
                await _run(proxy.passthrough)
    return fault


async def set_clock(world: World, i: int, offset_s: float, seconds: float, kind: str) -> Fault:
    """Set replica ``i``'s wall clock ``offset_s`` away from true time while it runs, for
    ``seconds``, then set it back (itself a step of ``-offset_s``)."""
    async with world.holding(kind, world.node(i), f"{offset_s:+g} s for {seconds:.1f} s") as f:
        write_clock(world.clock_files[i], offset_s)
        try:
            await hold(seconds, f"{world.node(i)} clock {offset_s:+g} s")
        finally:
            write_clock(world.clock_files[i], 0)
    return f


async def skew_clock(world: World, i: int, offset_s: float, seconds: float) -> Fault:
    return await set_clock(world, i, offset_s, seconds, SKEW)


async def jump_clock(world: World, i: int, offset_s: float, seconds: float) -> Fault:
    return await set_clock(world, i, offset_s, seconds, JUMP)


async def churn(world: World, rng: random.Random, seconds: float) -> list[Fault]:
    """Spare replicas join and leave every few seconds for ``seconds``: each stays 1-6 s and
    leaves by SIGTERM or SIGKILL, so ownership moves all the time."""
    done: list[Fault] = []
    end = now_ms() + seconds * 1000
    world.walking.add(CHURN)
    try:
        await _churn_until(world, rng, end, done)
    finally:
        world.walking.discard(CHURN)
    return done


async def _churn_until(world: World, rng: random.Random, end: float, done: list[Fault]) -> None:
    while now_ms() < end:
        free = [i for i in world.spare_indices if world.can_take(world.node(i))]
        if not free:
            break
        i = rng.choice(free)
        stay = rng.uniform(1.0, 6.0)
        how = rng.choice(["SIGTERM", "SIGKILL"])
        async with world.holding(CHURN, world.node(i), f"joined for {stay:.1f} s, {how}") as f:
            await _run(world._start, i)
            await hold(stay, f"{world.node(i)} member")
            f.start_ms = now_ms()  # failover is measured from the leave
            if how == "SIGKILL":
                await _run(world.fleet.kill, i)
            else:
                await _run(world.fleet.terminate, i)
            world._reap()
        done.append(f)
        await hold(rng.uniform(0.5, 3.0), "between churns")


def _deep(levels: int) -> str:
    return "[" * levels + "]" * levels


# Specs that once took a replica down or hung it (each as JSON text: some cannot be encoded
# by a test, only written), all under names and subjects no audited job uses.
POISON_SPECS: dict[str, str] = {
    "4520-character subject": json.dumps(
        {
            "name": "poison.subject",
            "schedule": "@every 1s",
            "subject": ("hrwcron.trigger.poison." + ".".join(["p" * 64] * 70))[:4_520],
        }
    ),
    "@every 70000000h, latest": json.dumps(
        {"name": "poison.every", "schedule": "@every 70000000h", "catchup": "latest"}
    ),
    "payload 983 levels deep": (
        '{"name": "poison.deep", "schedule": "@every 1s", "payload": ' + _deep(983) + "}"
    ),
    "host zone": json.dumps({"name": "poison.zone", "schedule": "@every 1s", "tz": "localtime"}),
    "400,000-character schedule": json.dumps(
        {"name": "poison.schedule", "schedule": "0 " * 200_000 + "*"}
    ),
    "200 KB payload": json.dumps(
        {"name": "poison.payload", "schedule": "@every 1s", "payload": "x" * 200_000}
    ),
    # Exclusions a bounded search cannot decide (issue 25): once 5 s of CPU per write, load
    # and status read; now refused naming exclude, and skipped when found in the bucket.
    "exclusions leaving no second": json.dumps(
        {
            "name": "poison.excl",
            "schedule": "* * * * * *",
            "exclude": ["0-58 * * * * *", "59 * * * * *"],
        }
    ),
    "exclusions of every other second": json.dumps(
        {
            "name": "poison.excl.odd",
            "schedule": "* * * * * *",
            "exclude": ["*/2 * * * * *", "1-59/2 * * * * *"],
        }
    ),
}


async def poison_job(world: World, rng: random.Random, seconds: float) -> Fault:
    """Write a hostile spec between ticks, either straight into the jobs bucket (every replica
    must skip it) or through the admin API (which must refuse it, writing nothing), leave it
    there for ``seconds``, then remove it. No replica may die of it: every replica that was
    running and not under another fault is still the same process afterwards."""
    case = rng.choice(sorted(POISON_SPECS))
    via = rng.choice(["bucket", "api"])
    text = POISON_SPECS[case]
    name = text.split('"name": "', 1)[1].split('"', 1)[0]
    async with world.holding(POISON, JOBS_TARGET, f"{case} through the {via}") as fault:
        before = {i: world.fleet.proc(i).pid for i in world.fleet.running()}
        client = await nats.connect(world.cluster.urls, connect_timeout=5)
        try:
            kv = await _retried(lambda: client.jetstream().key_value("hrwcron_jobs"), "jobs bucket")
            if via == "bucket":
                await _retried(lambda: kv.put(name, text.encode()), f"{case} written")
            else:
                # A paused or cut-off replica of the queue group never answers: ask again.
                body = b'{"spec": ' + text.encode() + b"}"
                reply = await _retried(
                    lambda: client.request("hrwcron.admin.jobs.put", body, timeout=3),
                    f"an answer to jobs.put of {case}",
                )
                error = json.loads(reply.data).get("error") or {}
                if error.get("code") != "bad_request" or not error.get("field"):
                    raise AssertionError(f"the admin API did not refuse {case}: {reply.data!r}")
            await hold(seconds, f"{case} in the jobs bucket")
            with contextlib.suppress(Exception):  # absent when the API refused it
                await kv.delete(name)
        finally:
            await client.close()
        lost = [
            world.node(i)
            for i, pid in before.items()
            if not _touched(world, world.node(i), fault.start_ms)
            and (i not in world.fleet.running() or world.fleet.proc(i).pid != pid)
        ]
        if lost:
            raise AssertionError(f"replicas lost to {case} through the {via}: {lost}")
    return fault


async def _retried(call: Callable[[], Awaitable[T]], what: str) -> T:
    """``call`` until it succeeds: another fault may be electing a NATS leader meanwhile."""
    return await wait_for_async(
        call, timeout=120, interval=0.5, message=what, ignore=(nats.errors.Error, TimeoutError)
    )


def _touched(world: World, target: str, since_ms: float) -> bool:
    """Whether another fault held ``target`` at any time since ``since_ms``."""
    return target in world.busy or any(
        f.target == target and (not f.end_ms or f.end_ms >= since_ms) for f in world.faults
    )


# --- schedules ----------------------------------------------------------------------------------


def pause_length(rng: random.Random, t: Timings) -> float:
    """Mostly around the member TTL and the claim lease; one in five longer than the duplicate
    window, up to three times it, which only fencing can make safe."""
    if rng.random() < 0.2:
        return rng.uniform(t.duplicate_window, 3 * t.duplicate_window)
    return rng.uniform(0.2, 3 * max(t.member_ttl, t.claim_lease))


def _free_replica(world: World, rng: random.Random, pool: Sequence[int] | None = None) -> int:
    candidates = [i for i in (pool or world.core) if world.can_take(world.node(i))]
    if not candidates:
        raise Unavailable("no replica can take a fault now")
    return rng.choice(candidates)


def make_fault(world: World, rng: random.Random, kind: str) -> Awaitable[Any]:
    """One fault of ``kind`` with random target and parameters; raises Unavailable when the
    world's limits do not allow it now."""
    t = world.timings
    if kind in (NATS_KILL, NATS_LEADER):
        nats_free(world)
        down = rng.uniform(1.0, 10.0)
        if kind == NATS_LEADER:
            return kill_stream_leader(world, down, rng.choice([STREAM, CLAIMS_STREAM]))
        return kill_nats_node(world, rng.randrange(len(world.cluster.servers)), down)
    if kind == ROLLING:
        if ROLLING in world.walking:
            raise Unavailable("a rolling upgrade is already under way")
        return rolling_upgrade(world)
    if kind == CHURN:
        if CHURN in world.walking:
            raise Unavailable("churn is already under way")
        return churn(world, rng, rng.uniform(5.0, 20.0))
    if kind == POISON:
        if not world.can_take(JOBS_TARGET):
            raise Unavailable("a poison job is already in place")
        return poison_job(world, rng, rng.uniform(2.0, 10.0))
    if kind in REPLICA_CLOCKS:
        clocks_apart(world, frozenset({SERVER_CLOCK}))
    i = _free_replica(world, rng)
    if kind == KILL:
        return kill_replica(world, i, rng.uniform(0.0, 2 * t.member_ttl + 2))
    if kind == PAUSE:
        return pause_replica(world, i, pause_length(rng, t))
    if kind == GRACEFUL:
        return graceful_restart(world, i)
    if kind == PARTITION:
        mode = rng.choice(PARTITION_MODES)
        return partition(world, i, mode, rng.uniform(1.0, 4 * t.member_ttl), rng.uniform(0.05, 1.5))
    if kind == SKEW:
        return skew_clock(world, i, rng.choice([2.0, -2.0]), rng.uniform(2.0, 10.0))
    if kind == JUMP:
        return jump_clock(world, i, rng.choice([30.0, -30.0]), rng.uniform(1.0, 10.0))
    raise ValueError(f"unknown fault kind {kind!r}")


Step = Callable[[], Awaitable[Any]]
# Makes one fault of a kind that make_fault does not know (the power faults, say).
Maker = Callable[[World, random.Random, str], Awaitable[Any]]


def nats_free(world: World) -> None:
    """Raise Unavailable unless every NATS node runs and none is held by a fault."""
    down = len(world.cluster.running()) < len(world.cluster.servers)
    if down or any(target.startswith("n") for target in world.busy):
        raise Unavailable("a NATS node is already down")


def clocks_apart(world: World, kinds: frozenset[str]) -> None:
    """Raise Unavailable while a fault of ``kinds`` holds a clock (see REPLICA_CLOCKS)."""
    if any(kind in kinds for kind in world.busy.values()):
        raise Unavailable("another clock is wrong at the moment")


def free_replica(world: World, rng: random.Random) -> int:
    """A core replica that can take a fault now (Unavailable if none can)."""
    return _free_replica(world, rng)


@dataclass
class Schedule:
    """Faults started one after another at random gaps, several at once."""

    world: World
    rng: random.Random
    kinds: Sequence[str] = ALL_KINDS
    max_active: int = 4
    gap_s: tuple[float, float] = (0.3, 3.0)
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    errors: list[BaseException] = field(default_factory=list)
    makers: Mapping[str, Maker] = field(default_factory=dict)

    def make(self, kind: str) -> Awaitable[Any]:
        return self.makers.get(kind, make_fault)(self.world, self.rng, kind)

    def _launch(self, step: Step) -> bool:
        """Start ``step`` if there is room and its target is free; False otherwise."""
        if len(self.tasks) >= self.max_active:
            return False
        try:
            coro = step()
        except Unavailable:
            return False
        task = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self._done)
        return True

    def _done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None and not isinstance(exc, Unavailable):
            self.errors.append(exc)

    async def script(self, steps: Sequence[tuple[str, Step]], timeout: float = 300.0) -> None:
        """Start each step in order as soon as there is room and a free target for it."""
        for name, step in steps:
            await wait_for_async(
                lambda step=step: self._launch(step),  # type: ignore[misc]
                timeout=timeout,
                interval=0.25,
                message=f"room for the fault {name!r}",
            )
            await hold(self.rng.uniform(*self.gap_s), "gap between faults")

    async def tour(self) -> None:
        """Every kind of the schedule once, in a shuffled order."""
        kinds = list(self.kinds)
        self.rng.shuffle(kinds)
        await self.script([(k, lambda k=k: self.make(k)) for k in kinds])

    async def run_for(self, seconds: float) -> None:
        """Random faults of the schedule's kinds until ``seconds`` have passed."""
        end = now_ms() + seconds * 1000
        kinds = list(self.kinds)
        weights = [WEIGHTS.get(kind, 1) for kind in kinds]
        while now_ms() < end:
            kind = self.rng.choices(kinds, weights)[0]
            if self._launch(lambda kind=kind: self.make(kind)):  # type: ignore[misc]
                await hold(self.rng.uniform(*self.gap_s), "gap between faults")
            else:
                await hold(0.2, "room for a fault")

    async def finish(self, timeout: float = 600.0, *, raise_errors: bool = True) -> None:
        """Let every running fault run its course, heal the rest, and raise the first error a
        fault hit (or leave them in ``errors``)."""
        if self.tasks:
            await asyncio.wait_for(asyncio.gather(*self.tasks, return_exceptions=True), timeout)
        await self.world.heal()
        if self.errors and raise_errors:
            raise self.errors[0]


def counts(faults: Sequence[Fault]) -> dict[str, int]:
    found: dict[str, int] = {}
    for fault in faults:
        key = f"{fault.kind} ({fault.detail.split()[0]})" if fault.kind == PARTITION else fault.kind
        found[key] = found.get(key, 0) + 1
    return dict(sorted(found.items()))


def leave_events(
    faults: Sequence[Fault], *, isolated: bool = False, quiet_s: float = 10.0
) -> list[tuple[str, float, str]]:
    """(replica, instant, kind) of every fault that took a replica away from the work. With
    ``isolated``, only those with no NATS node down from ``quiet_s`` before to ``quiet_s``
    after: an election under way says more about the election than about failover."""
    nats = [f for f in faults if f.target.startswith("n")]
    found = []
    for f in faults:
        if f.kind not in TAKES_A_REPLICA or not f.target.startswith("r"):
            continue
        begin, end = f.start_ms - quiet_s * 1000, f.start_ms + quiet_s * 1000
        if isolated and any(n.start_ms < end and (n.end_ms or end) > begin for n in nats):
            continue
        found.append((f.target, f.start_ms, f.kind))
    return found


__all__ = [
    "ALL_KINDS",
    "CHURN",
    "GRACEFUL",
    "JUMP",
    "KILL",
    "NATS_KILL",
    "NATS_LEADER",
    "PARTITION",
    "PARTITION_MODES",
    "PAUSE",
    "POISON",
    "POISON_SPECS",
    "REPLICA_CLOCKS",
    "ROLLING",
    "SERVER_CLOCK",
    "SKEW",
    "WEIGHTS",
    "Fault",
    "Maker",
    "Schedule",
    "Step",
    "Timings",
    "Unavailable",
    "World",
    "churn",
    "clock_file_env",
    "clocks_apart",
    "counts",
    "free_replica",
    "graceful_restart",
    "jump_clock",
    "kill_nats_node",
    "kill_replica",
    "kill_stream_leader",
    "leave_events",
    "make_fault",
    "nats_free",
    "partition",
    "pause_replica",
    "poison_job",
    "reap_faketime",
    "rolling_upgrade",
    "skew_clock",
    "streams_current",
    "write_clock",
]
