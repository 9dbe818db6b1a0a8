"""Membership alone, on the in-memory members bucket and a hand-driven clock: readiness fails
closed, the candidates and ranks agree across replicas, claim holders count as live only while
heard from, and a digest that differs is reported."""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from harness import wait_for_async
from harness.engine_parts import Clocks, State
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryMembers
from hrwcron.core.model import JobSpec
from hrwcron.engine.clock import Clock
from hrwcron.engine.jobs import HeldClaim, Job
from hrwcron.engine.membership import Membership
from hrwcron.engine.ports import NullObserver
from hrwcron.engine.settings import Settings

TTL = 3.0


@dataclass
class Seen(NullObserver):
    mismatched: list[list[str]] = field(default_factory=list)

    def digest_mismatch(self, mismatched: list[str]) -> None:
        self.mismatched.append(mismatched)


@dataclass
class Replica:
    membership: Membership
    state: State
    observer: Seen
    changes: list[tuple[bool, bool]]


def replica(
    node: str, members: MemoryMembers, clocks: Clocks, interval: float = 1.0, holders: int = 0
) -> Replica:
    state, observer = State(), Seen()
    changes: list[tuple[bool, bool]] = []
    membership = Membership(
        Settings(
            node_id=node,
            member_ttl=TTL,
            heartbeat_interval=interval,
            claim_lease=2.0,
            holders=holders,
        ),
        members,
        instance=f"{node}-instance",
        observer=observer,
        clock=Clock(clocks.wall, clocks.monotonic),
        state=state,
        changed=lambda readiness, candidates: changes.append((readiness, candidates)),
    )
    return Replica(membership, state, observer, changes)


def shared() -> tuple[Clocks, MemoryMembers]:
    clocks = Clocks()
    return clocks, MemoryMembers(TTL, now=clocks.monotonic, server_clock=lambda: clocks.real_ms)


def job(name: str) -> Job:
    spec = JobSpec(name=name, schedule="@every 1m")
    plan = spec.plan()
    return Job(spec, plan.schedule, plan, "s", 0, 1, 0)


async def test_readiness_fails_closed_until_joined_loaded_and_not_stopping() -> None:
    clocks, members = shared()
    a = replica("a", members, clocks)
    assert a.membership.not_ready_reason == "heartbeat is not reaching NATS"
    await a.membership.join()
    assert a.membership.ready
    a.state.loading = True
    assert a.membership.not_ready_reason == "loading jobs and trigger history"
    a.state.loading = False
    clocks.advance(TTL * 1000 + 1)  # no beat within the member TTL
    assert a.membership.not_ready_reason == "heartbeat is not reaching NATS"
    a.state.stopping = True
    assert a.membership.not_ready_reason == "stopping"


async def test_a_change_is_told_once_and_the_replicas_agree_on_the_ranks() -> None:
    clocks, members = shared()
    a, b = replica("a", members, clocks), replica("b", members, clocks)
    for r in (a, b):
        await r.membership.join()
    for r in (a, b):
        await r.membership.beat()  # now announcing "ready"
    for r in (a, b):
        r.membership.view.replace_all(await members.snapshot())
        r.membership.refresh()
        assert r.changes == [(True, True)]
        r.membership.refresh()
        assert r.changes == [(True, True)], "nothing changed, nothing told"
        assert [c.node for c in r.membership.candidates] == ["a", "b"]
    on_a, on_b = job("j"), job("j")
    a.membership.place(on_a)
    b.membership.place(on_b)
    assert on_a.first == on_b.first in ("a", "b")
    assert {on_a.my_rank, on_b.my_rank} == {0, 1}
    assert a.membership.ranking_of("j", []) == [on_a.first, "b" if on_a.first == "a" else "a"]
    # b leaves: a drops it, tells the change, and ranks the job again.
    await b.membership.leave()
    a.membership.view.replace_all(await members.snapshot())
    a.membership.refresh()
    assert a.changes[-1] == (False, True)
    a.membership.place(on_a)
    assert (on_a.first, on_a.my_rank) == ("a", 0)


async def test_a_claim_holder_is_live_while_heard_from_as_the_same_ready_instance() -> None:
    clocks, members = shared()
    a, b = replica("a", members, clocks), replica("b", members, clocks)
    await a.membership.join()
    await b.membership.join()
    await b.membership.beat()
    a.membership.view.replace_all(await members.snapshot())
    assert a.membership.holder_live("b", "b-instance")
    assert not a.membership.holder_live("b", "an-older-instance")
    assert not a.membership.holder_live("c", "c-instance")
    held = HeldClaim(revision=1, seen_mono=clocks.monotonic(), node="b", instance="b-instance")
    wait = a.membership.holder_wait(held)
    assert wait is not None and wait > clocks.real_ms  # server time: no offset here
    clocks.advance(2_000)  # beyond the heartbeat interval plus its margin
    assert not a.membership.holder_live("b", "b-instance")
    assert a.membership.holder_wait(held) is None


async def test_a_live_replica_with_another_job_digest_is_reported() -> None:
    clocks, members = shared()
    a, b = replica("a", members, clocks), replica("b", members, clocks)
    b.state.digest = "00000000000000bb"
    await a.membership.join()
    await b.membership.join()
    a.membership.view.replace_all(await members.snapshot())
    a.membership.check_digests()
    assert a.observer.mismatched[-1] == ["b"]
    b.state.digest = a.state.digest
    await b.membership.beat()
    a.membership.view.replace_all(await members.snapshot())
    a.membership.check_digests()
    assert a.observer.mismatched[-1] == []


async def test_another_replica_writing_our_node_id_is_fatal() -> None:
    clocks, members = shared()
    a = replica("a", members, clocks, interval=0.01)
    await a.membership.join()
    impostor = replica("a", members, clocks)
    impostor.membership.instance = "impostor"
    await members.deregister("a")
    await members.register("a", impostor.membership.heartbeat(), wait=0)
    loop = asyncio.create_task(a.membership.heartbeat_loop())
    try:
        await wait_for_async(a.membership.failed.is_set, timeout=5, message="failed")
        assert "being written by another replica" in a.membership.not_ready_reason
    finally:
        a.state.stopping = True
        loop.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await loop


class NoSamples(MemoryMembers):
    """A members bucket whose heartbeat writes land but whose timestamps cannot be read (a
    server too busy to answer, or the message already expired)."""

    async def stored_at(self, revision: int) -> float | None:
        raise TimeoutError("nats: timeout")


async def test_a_beat_that_landed_is_not_failed_for_want_of_its_clock_sample() -> None:
    clocks = Clocks()
    members = NoSamples(TTL, now=clocks.monotonic, server_clock=lambda: clocks.real_ms)
    a = replica("a", members, clocks)
    await a.membership.join()
    before = (await members.snapshot())["a"].heartbeat
    clocks.advance(1000)
    await a.membership.beat()  # does not raise: the write is what a heartbeat is
    assert (await members.snapshot())["a"].heartbeat.jobs == before.jobs
    assert a.membership._revision > 0


async def test_a_replica_cut_off_from_nats_keeps_its_lanes_until_it_hears_again() -> None:
    clocks, members = shared()
    nodes = ["a", "b", "c"]
    fleet = {n: replica(n, members, clocks, holders=2) for n in nodes}
    for r in fleet.values():
        await r.membership.join()
    a = fleet["a"].membership
    a.view.replace_all(await members.snapshot())
    a.refresh()
    held = a.held
    assert held is not None and 0 < len(held) < 8192
    # Nothing heard for longer than a TTL, its own beats and reads included (NATS is too
    # busy to answer): the others are not known to be gone, so it keeps what it holds.
    clocks.advance(TTL * 1000 + 1)
    a.refresh()
    assert not a.ready
    assert a.held == held
    # Heard again, and b and c are gone by then: it takes the lanes on.
    for gone in ("b", "c"):
        await fleet[gone].membership.leave()
    await a.beat()
    a._beat_ok = a._clock.monotonic()
    a.view.replace_all(await members.snapshot())
    a._view_ok = a._clock.monotonic()
    a.refresh()
    assert a.held is not None and len(a.held) > len(held)
