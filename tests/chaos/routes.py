"""Faults between the NATS servers themselves, on a cluster whose routes go through
forwarders (``NatsCluster(route_links=True)``, ``harness/links.py``): the partitions a Jepsen
test leads with, a bridge, a one-way loss and a slow link, each healed again.

* **split**: one node cut off from the other two, with the trigger stream's leader on the
  minority side (it must lose its leadership to the majority, whatever it accepted meanwhile
  without a quorum) or on the majority side; the links reset (``cut``) or silently drop
  everything (``blackhole``).
* **bridge**: two nodes cannot reach each other, the third reaches both: each half has a
  majority through the bridge node.
* **one-way**: everything from one node to another is lost, the reverse passes.
* **latency**: one link delays every chunk by hundreds of milliseconds plus jitter, both ways.

Each holds the world's NATS slot (no node is killed or powered off meanwhile, so a majority of
servers stays reachable) and ends only once every stream is current again. Replicas stay
connected to servers on both sides: before a split, a replica is moved (its other proxies
refuse it for a moment) if no running replica was on one of the sides.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable
from typing import Any

from harness import wait_for_async
from harness.chaos import now_ms, wait_until_ms
from harness.links import CUT, DELAY, LOSE, Direction, LinkNet

from .faults import STREAM, Fault, Unavailable, World, hold, nats_free, streams_current

ROUTE_SPLIT = "NATS route partition"
ROUTE_BRIDGE = "NATS route bridge"
ROUTE_ONE_WAY = "NATS route one-way loss"
ROUTE_LATENCY = "NATS route latency"
ROUTE_KINDS = (ROUTE_SPLIT, ROUTE_BRIDGE, ROUTE_ONE_WAY, ROUTE_LATENCY)
STEER = "replica moved to a NATS node"  # set-up for a split, not a fault of its own


def links(world: World) -> LinkNet:
    net = world.cluster.links
    if net is None:
        raise Unavailable("the cluster's routes do not go through forwarders")
    return net


def connected_to(world: World, i: int) -> int | None:
    """The NATS node replica ``i`` is connected to (through its own proxies), if any."""
    for j, proxy in enumerate(world.proxies[i]):
        if proxy.active_connections:
            return j
    return None


async def steer(world: World, i: int, node: int) -> Fault:
    """Move replica ``i``'s connection to NATS ``node``: its other proxies refuse it until it
    has reconnected there."""
    async with world.holding(STEER, world.node(i), f"to n{node}") as fault:
        others = [p for j, p in enumerate(world.proxies[i]) if j != node]
        for proxy in others:
            await asyncio.to_thread(proxy.drop)
        try:
            await wait_for_async(
                lambda: connected_to(world, i) == node,
                timeout=30,
                interval=0.1,
                message=f"{world.node(i)} connected to n{node}",
            )
        finally:
            for proxy in others:
                await asyncio.to_thread(proxy.passthrough)
    return fault


async def _sides_covered(world: World, minority: set[int]) -> str:
    """Make sure a running core replica is connected on each side of the split; returns who is
    where, for the report."""
    majority = [j for j in range(len(world.cluster.servers)) if j not in minority]
    for _ in range(2):
        placed = {i: connected_to(world, i) for i in world.core if i in world.fleet.running()}
        inside = [i for i, j in placed.items() if j in minority]
        outside = [i for i, j in placed.items() if j is not None and j not in minority]
        if inside and outside:
            return (
                f"replicas {' '.join(world.node(i) for i in inside)} on the minority, "
                f"{' '.join(world.node(i) for i in outside)} on the majority"
            )
        crowded = inside or outside  # one of them stays where they all are
        movable = [i for i in crowded if world.can_take(world.node(i))]
        if len(crowded) < 2 or not movable:
            break
        await steer(world, movable[0], majority[0] if inside else min(minority))
    return "replicas all on one side"


async def _healed(world: World, what: str) -> None:
    links(world).heal()
    await wait_for_async(
        lambda: asyncio.to_thread(streams_current, world.cluster),
        timeout=120,
        interval=0.5,
        message=f"every stream current after {what} healed",
    )


async def split(
    world: World,
    seconds: float,
    *,
    leader_side: str,
    blackhole: bool = False,
    rng: random.Random | None = None,
) -> Fault:
    """One node cut off from the others for ``seconds``; the trigger stream's leader on
    ``leader_side`` (``minority`` or ``majority``). With the leader on the minority the split
    lasts at least until the majority has elected another (nats-server waits 4-9 s first)."""
    net = links(world)
    cluster = world.cluster
    leader = await asyncio.to_thread(cluster.wait_stream_leader, STREAM, 60)
    nodes = list(range(len(cluster.servers)))
    if leader_side == "minority":
        minority = leader
    else:
        minority = (rng or random.Random(leader)).choice([j for j in nodes if j != leader])
    rest = [j for j in nodes if j != minority]
    how = "blackhole" if blackhole else "cut"
    detail = f"n{minority} alone, {STREAM} leader n{leader} on the {leader_side}, {how}"
    async with world.holding(ROUTE_SPLIT, cluster.names[minority], detail) as fault:
        fault.detail += f"; {await _sides_covered(world, {minority})}"
        fault.start_ms = now_ms()  # placing replicas is set-up: the fault starts here
        end = fault.start_ms + seconds * 1000
        net.cut([[minority], rest], Direction(LOSE if blackhole else CUT))
        try:
            if leader_side == "minority":
                elected = await wait_for_async(
                    lambda: asyncio.to_thread(majority_leader, world, rest),
                    timeout=60,
                    interval=0.25,
                    message=f"the majority {rest} electing a leader of {STREAM}",
                    ignore=(OSError, ValueError, RuntimeError),
                )
                fault.detail += f"; majority elected {elected} after {fault.seconds:.1f} s"
            await wait_until_ms(end, what=f"n{minority} split off")
            across = sum(net.connections(minority, j) for j in rest)
            fault.detail += f"; {across} route connections across"
        finally:
            await _healed(world, f"the split of n{minority}")
    return fault


def majority_leader(world: World, majority: list[int]) -> str:
    """The trigger stream's leader if every node of ``majority`` names the same one among
    them, else empty."""
    cluster = world.cluster
    names = set()
    for j in majority:
        view = cluster.servers[j].jsz(accounts=True, streams=True)
        for account in view.get("account_details") or []:
            for stream in account.get("stream_detail") or []:
                if stream.get("name") == STREAM:
                    names.add((stream.get("cluster") or {}).get("leader") or "")
    leader = names.pop() if len(names) == 1 else ""
    return leader if leader in {cluster.names[j] for j in majority} else ""


async def bridge(world: World, seconds: float, via: int) -> Fault:
    """The two nodes other than ``via`` cannot reach each other; ``via`` reaches both."""
    net = links(world)
    a, b = (j for j in range(len(world.cluster.servers)) if j != via)
    detail = f"n{a} x n{b}, bridged by n{via}"
    async with world.holding(ROUTE_BRIDGE, world.cluster.names[via], detail) as fault:
        net.set_link(a, b, Direction(CUT))
        try:
            await hold(seconds, f"n{a} and n{b} apart")
        finally:
            await _healed(world, f"the bridge at n{via}")
    return fault


async def one_way(world: World, seconds: float, src: int, dst: int) -> Fault:
    """Everything ``src`` sends ``dst`` is lost; what ``dst`` sends ``src`` arrives."""
    net = links(world)
    detail = f"n{src} -> n{dst} lost"
    async with world.holding(ROUTE_ONE_WAY, world.cluster.names[src], detail) as fault:
        net.set_way(src, dst, Direction(LOSE))
        try:
            await hold(seconds, f"n{src} -> n{dst} lost")
        finally:
            await _healed(world, f"the loss from n{src} to n{dst}")
    return fault


async def latency(
    world: World, seconds: float, a: int, b: int, delay_s: float, jitter_s: float
) -> Fault:
    """The link between ``a`` and ``b`` slow both ways."""
    net = links(world)
    way = Direction(DELAY, delay_s, jitter_s)
    detail = f"n{a} <-> n{b} {way}"
    async with world.holding(ROUTE_LATENCY, world.cluster.names[a], detail) as fault:
        net.set_link(a, b, way)
        try:
            await hold(seconds, f"n{a} <-> n{b} slow")
        finally:
            await _healed(world, f"the slow link n{a} <-> n{b}")
    return fault


def make_route_fault(world: World, rng: random.Random, kind: str) -> Awaitable[Any]:
    """One route fault of ``kind`` with random nodes and lengths (a :data:`faults.Maker`)."""
    links(world)
    nats_free(world)
    size = len(world.cluster.servers)
    longest = max(3.0, world.timings.max_lateness * 0.4)
    seconds = rng.uniform(2.0, longest)
    if kind == ROUTE_SPLIT:
        side = rng.choice(["minority", "majority"])
        return split(world, seconds, leader_side=side, blackhole=rng.random() < 0.5, rng=rng)
    if kind == ROUTE_BRIDGE:
        return bridge(world, seconds, rng.randrange(size))
    if kind == ROUTE_ONE_WAY:
        src, dst = rng.sample(range(size), 2)
        return one_way(world, seconds, src, dst)
    if kind == ROUTE_LATENCY:
        a, b = rng.sample(range(size), 2)
        return latency(world, seconds, a, b, rng.uniform(0.1, 0.5), rng.uniform(0.0, 0.3))
    raise ValueError(f"unknown route fault {kind!r}")
