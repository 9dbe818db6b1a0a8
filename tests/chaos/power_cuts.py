"""Power failures of NATS nodes, for worlds whose cluster is a :class:`harness.power.PowerCluster`
(every node's store on a filesystem that loses what was not fsynced).

Three shapes, as a power failure meets a cluster:

* **one node** loses power and boots again: its peers hold everything it lost, if they
  acknowledged it before it was lost on this node;
* **a minority together with a process pause**: a follower of the trigger stream loses power
  while the stream's leader is frozen (SIGSTOP), so the follower, once booted, and the third
  node form the majority that elects the next leader, from logs that may have lost their tail;
  then the old leader wakes up and must follow them;
* **every node at once**, like a data centre's power, then all boot together.

A power failure takes the cluster below a majority in the last two shapes: these faults never
overlap another NATS fault, and are kept short so that the ticks due meanwhile are still inside
their lateness window when the cluster is back. What the stream keeps is judged by the checker
(a missing or late tick) and by the replicas' ack journal (an acknowledged trigger lost).
"""

from __future__ import annotations

import random
from typing import Any

from harness import wait_for_async
from harness.power import Cut, PowerCluster

from .faults import (
    CLAIMS_STREAM,
    STREAM,
    Fault,
    Unavailable,
    World,
    _run,
    hold,
    nats_free,
    streams_current,
)

POWER_ONE = "power loss, one NATS node"
POWER_MINORITY = "power loss, minority + paused leader"
POWER_ALL = "power loss, every NATS node"
POWER_KINDS = (POWER_ONE, POWER_MINORITY, POWER_ALL)

__all__ = [
    "POWER_ALL",
    "POWER_KINDS",
    "POWER_MINORITY",
    "POWER_ONE",
    "make_power_fault",
    "power_cut_all",
    "power_cut_minority",
    "power_cut_one",
]


def _cluster(world: World) -> PowerCluster:
    if not isinstance(world.cluster, PowerCluster):
        raise TypeError("power faults need a world whose cluster is a PowerCluster")
    return world.cluster


def _dropped(cuts: list[Cut]) -> str:
    return ", ".join(f"{c.node} lost {c.bytes // 1024} KiB in {c.files} files" for c in cuts)


async def _current(world: World, what: str) -> None:
    await wait_for_async(
        lambda: _run(streams_current, world.cluster),
        timeout=180,
        interval=0.5,
        message=f"every stream current after {what}",
    )


async def power_cut_one(world: World, j: int, down_s: float) -> Fault:
    """Node ``j`` loses power, stays off ``down_s``, boots on the same store."""
    cluster = _cluster(world)
    name = cluster.names[j]
    async with world.holding(POWER_ONE, name, f"off {down_s:.1f} s") as fault:
        cuts = await _run(cluster.power_cut, [j])
        fault.detail += "; " + _dropped(cuts)
        await hold(down_s, f"{name} off")
        await _run(cluster.power_on, [j])
        await _current(world, f"{name} booted")
    return fault


async def power_cut_minority(
    world: World,
    down_s: float,
    pause_s: float,
    stream: str = STREAM,
    rng: random.Random | None = None,
) -> Fault:
    """A follower of ``stream`` (drawn by ``rng``, else the first) loses power while its
    leader is paused; the follower boots after ``down_s`` and the leader wakes ``pause_s``
    after the cut (later than the boot)."""
    cluster = _cluster(world)
    leader = await _run(cluster.wait_stream_leader, stream)
    followers = [i for i in range(cluster.size) if i != leader]
    follower = rng.choice(followers) if rng is not None else followers[0]
    names = f"{cluster.names[follower]}+{cluster.names[leader]}"
    detail = f"{stream}: off {down_s:.1f} s, leader paused {pause_s:.1f} s"
    async with world.holding(POWER_MINORITY, names, detail) as fault:
        cluster.servers[leader].pause()
        try:
            cuts = await _run(cluster.power_cut, [follower])
            fault.detail += "; " + _dropped(cuts)
            await hold(down_s, f"{cluster.names[follower]} off")
            await _run(lambda: cluster.power_on([follower], formed=False))
            await hold(max(0.0, pause_s - down_s), f"{cluster.names[leader]} paused")
        finally:
            cluster.servers[leader].resume()
        await _run(cluster.wait_formed, 60.0)
        await _current(world, f"{names} back")
    return fault


async def power_cut_all(world: World, down_s: float) -> Fault:
    """Every node loses power at the same instant; all boot after ``down_s``."""
    cluster = _cluster(world)
    nodes = list(range(cluster.size))
    async with world.holding(POWER_ALL, "+".join(cluster.names), f"off {down_s:.1f} s") as fault:
        cuts = await _run(cluster.power_cut, nodes)
        fault.detail += "; " + _dropped(cuts)
        await hold(down_s, "every node off")
        await _run(cluster.power_on, nodes, 120.0)
        await _current(world, "every node booted")
    return fault


def make_power_fault(world: World, rng: random.Random, kind: str) -> Any:
    """One power fault of ``kind`` with random parameters (Unavailable while another NATS
    fault holds a node)."""
    nats_free(world)
    if kind == POWER_ONE:
        return power_cut_one(world, rng.randrange(world.cluster.size), rng.uniform(1.0, 8.0))
    if kind == POWER_MINORITY:
        down = rng.uniform(0.5, 2.0)
        stream = rng.choice([STREAM, CLAIMS_STREAM])
        return power_cut_minority(world, down, down + rng.uniform(2.0, 5.0), stream, rng)
    if kind == POWER_ALL:
        return power_cut_all(world, rng.uniform(0.5, 2.0))
    raise Unavailable(f"not a power fault: {kind!r}")
