"""Faults in a NATS server's clock (``NatsCluster(server_clocks=True)``, ``clock_files.py``):
one node's wall clock skewed or stepped while it runs, with the members bucket's leader on
it or off it.

Replicas take their time from the stamps of their heartbeats, that is from the members
bucket's leader; the trigger stream's leader stamps the triggers, which the checker judges by.
A fault here therefore keeps the trigger stream's leader off the shifted node (it is moved
away first): its stamps would be off by the offset however right the replicas fire, which
``test_server_clocks.py`` shows on its own. What a fault may do with the members leader on the
shifted node, and the checker must find nothing wrong with:

* an offset beyond ``max_clock_skew`` or a step of 30 s, either way: every replica's own clock
  disagrees with its time source, so all of them report not ready and fire nothing (fail
  closed) until the server's clock is set right; the ticks due meanwhile fire late, within
  their lateness window, since a fault lasts less than that;
* a server clock behind by less than ``max_clock_skew``: the replicas follow it and fire late by
  the offset.

No replica's own clock is wrong meanwhile (``faults.REPLICA_CLOCKS``): one stepped with its
time source would agree with it, the stated limit of the design.

A server clock *ahead* by less than ``max_clock_skew`` makes triggers early by the offset on
every other clock (the stated limit, shown in ``test_server_clocks.py``), so a random run
does not draw it.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Awaitable
from typing import Any

from nats.aio.client import Client

from harness import NatsCluster, wait_for_async
from hrwcron.core.resources import MEMBERS_BUCKET, TRIGGER_STREAM

from .faults import (
    REPLICA_CLOCKS,
    SERVER_CLOCK,
    Fault,
    Maker,
    World,
    clocks_apart,
    hold,
    nats_free,
)

MEMBERS_STREAM = f"KV_{MEMBERS_BUCKET}"
# Beyond the shipped max_clock_skew (1 s) either way, a step as an operator or a restored VM
# makes it, and behind by less than the skew.
OFFSETS_S = (2.0, -2.0, 5.0, -5.0, 30.0, -30.0, -0.5, -0.8)


async def step_down(client: Client, stream: str, preferred: str | None = None) -> None:
    """Ask ``stream``'s leader to step down, in favour of ``preferred`` if given."""
    body = {"placement": {"preferred": preferred}} if preferred else {}
    reply = await client.request(
        f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", json.dumps(body).encode(), timeout=5
    )
    answer = json.loads(reply.data)
    if answer.get("error"):
        raise RuntimeError(f"step-down of {stream} refused: {answer['error']}")


async def lead(
    cluster: NatsCluster, client: Client, stream: str, *, on: int | None = None, off: int = -1
) -> int:
    """Move ``stream``'s leadership onto node ``on``, or off node ``off``; the leader's index."""

    async def placed() -> list[int]:
        leader = await asyncio.to_thread(cluster.stream_leader, stream)
        if leader is None:
            return []
        if (on is not None and leader != on) or leader == off:
            await step_down(client, stream, cluster.names[on] if on is not None else None)
            return []
        return [leader]

    found = await wait_for_async(
        placed,
        timeout=60,
        interval=1.0,
        message=f"{stream} led {'by n' + str(on) if on is not None else 'off n' + str(off)}",
        ignore=(OSError, TimeoutError, RuntimeError),
    )
    return found[0]


async def shift_server_clock(
    world: World, client: Client, node: int, offset_s: float, seconds: float
) -> Fault:
    """Node ``node``'s wall clock ``offset_s`` off true time for ``seconds``, then set right
    again (itself a step back); the trigger stream led elsewhere throughout."""
    cluster = world.cluster
    name = cluster.names[node]
    async with world.holding(SERVER_CLOCK, name, f"{offset_s:+g} s for {seconds:.1f} s") as f:
        await lead(cluster, client, TRIGGER_STREAM, off=node)
        members = await asyncio.to_thread(cluster.stream_leader, MEMBERS_STREAM)
        where = "on it" if members == node else f"on n{members}"
        f.detail += f", members leader {where}"
        cluster.set_clock(node, offset_s)
        try:
            await hold(seconds, f"{name} clock {offset_s:+g} s")
        finally:
            cluster.set_clock(node, 0)
        moved = await asyncio.to_thread(cluster.stream_leader, TRIGGER_STREAM)
        if moved == node:
            f.detail += f"; {TRIGGER_STREAM} leadership moved onto it meanwhile"
    return f


def server_clock_maker(client: Client) -> Maker:
    """Makes server clock faults (a :data:`faults.Maker`) that move leaders through ``client``."""

    def make(world: World, rng: random.Random, kind: str) -> Awaitable[Any]:
        """The node leading the members bucket (most often) or another one, an offset of
        :data:`OFFSETS_S`, for less than half the lateness window."""
        nats_free(world)
        clocks_apart(world, REPLICA_CLOCKS)
        if world.cluster.clock_files is None:
            raise ValueError("the cluster runs without server clocks")
        members = world.cluster.stream_leader(MEMBERS_STREAM)
        size = len(world.cluster.servers)
        node = members if members is not None and rng.random() < 0.7 else rng.randrange(size)
        seconds = rng.uniform(2.0, max(3.0, world.timings.max_lateness * 0.4))
        return shift_server_clock(world, client, node, rng.choice(OFFSETS_S), seconds)

    return make
