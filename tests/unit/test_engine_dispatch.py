"""The dispatcher alone, on the in-memory claims and trigger stream, driven through its
TickHost interface: a tick is claimed then published once, a tick claimed by a live replica
is left to it, a published tick is not claimed again, and a late tick is not published."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryClaims, MemoryTriggers
from hrwcron.core.model import ClaimRecord, JobSpec
from hrwcron.core.outcomes import RESOLVED, Outcome
from hrwcron.core.ticks import TickId
from hrwcron.engine.clock import Clock
from hrwcron.engine.dispatch import Dispatcher
from hrwcron.engine.failpoints import Failpoints
from hrwcron.engine.flight import Flight
from hrwcron.engine.jobs import Job
from hrwcron.engine.ledger import TriggerLedger
from hrwcron.engine.ports import NullObserver
from hrwcron.engine.run_counter import RunCounter
from hrwcron.engine.settings import Settings


@dataclass
class Host:
    stopping: bool = False
    quiet: bool = False  # no trigger feed: a held claim is checked against the subject
    clock_off: bool = False  # the server's clock and this replica's disagree
    live: bool = True  # whether the holders of claims are live and ready
    acted_on: list[Flight] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def claim_ttl(self, job: Job) -> float:
        return 30.0

    def holder_live(self, node: str, instance: str) -> bool:
        return self.live

    def mark_bad(self, job: Job, problem: str) -> None:
        self.errors.append(problem)

    def log_error(self, job: Job, tick_key: str, error: str) -> None:
        self.errors.append(error)

    def acted(self, flight: Flight) -> None:
        self.acted_on.append(flight)


def spawn(coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
    return asyncio.create_task(coro, name=name)


def dispatcher(
    node: str, claims: MemoryClaims, triggers: MemoryTriggers
) -> tuple[Dispatcher, Host, TriggerLedger]:
    host = Host()
    ledger = TriggerLedger(
        triggers, observer=NullObserver(), newer=lambda s, t: None, retry_after=1.0
    )
    clock = Clock()
    return (
        Dispatcher(
            host,
            Settings(node_id=node),
            claims=claims,
            triggers=triggers,
            runs=None,
            ledger=ledger,
            counter=RunCounter(None, spawn),
            observer=NullObserver(),
            clock=clock,
            failpoints=Failpoints({}),
            instance=f"{node}-instance",
        ),
        host,
        ledger,
    )


def job() -> Job:
    spec = JobSpec(name="j", schedule="@every 1m")
    plan = spec.plan()
    return Job(spec, plan.schedule, plan, spec.trigger_subject("hrwcron.trigger"), 0, 1, 0)


def due_now() -> int:
    return int(time.time() * 1000) // 1000 * 1000


async def test_a_tick_is_claimed_then_published_once() -> None:
    claims, triggers = MemoryClaims(), MemoryTriggers()
    a, host, ledger = dispatcher("a", claims, triggers)
    tick = Flight(job(), 0, due_now(), 0)
    await a.run([tick])
    assert tick.outcome == "started", tick.error
    assert host.acted_on == [tick]
    assert [m.headers["Nats-Msg-Id"] for m in triggers.messages] == [tick.msg_id]
    assert ledger.last[tick.job.subject].msg_id == TickId("j", tick.due).key
    # Its subject unknown here, the claim of the tick before it (still in its window) is read.
    assert (a.creates, a.reads, a.replaces) == (1, 1, 0)


async def test_a_tick_claimed_by_a_live_replica_is_left_to_it_and_a_published_one_is_done() -> None:
    claims, triggers = MemoryClaims(), MemoryTriggers()
    a, _, ledger_a = dispatcher("a", claims, triggers)
    b, _, ledger_b = dispatcher("b", claims, triggers)
    due = due_now()
    await a.run([Flight(job(), 0, due, 0)])
    second = Flight(job(), 0, due, 1)
    await b.run([second])
    assert second.outcome == "lock_busy"  # its claim is held by a live, ready replica
    assert second.job.claim_seen is not None and second.job.claim_seen.node == "a"
    ledger_b.remember(second.job.subject, ledger_a.last[second.job.subject])
    third = Flight(job(), 0, due, 1)
    await b.run([third])
    assert third.outcome == "not_owner"  # in the stream already: no claim is even tried
    assert len(triggers.messages) == 1


async def test_a_quiet_replica_asks_the_subject_whether_a_live_holder_published() -> None:
    """With no trigger feed, a follower that finds the claim held by a live replica reads the
    subject: published, the tick is done; not yet, it leaves the tick to the holder."""
    claims, triggers = MemoryClaims(), MemoryTriggers()
    a, _, _ = dispatcher("a", claims, triggers)
    b, host_b, ledger_b = dispatcher("b", claims, triggers)
    host_b.quiet = True
    due = due_now()
    held = ClaimRecord(node="a", instance=a.instance, attempt=1, claimed_ms=due)
    assert await claims.create(TickId("j", due).claim_key, held, 30.0)  # claimed, not published
    early = Flight(job(), 0, due, 1)
    await b.run([early])
    assert early.outcome == "lock_busy"
    assert ledger_b.last.get(early.job.subject) is None
    await a.run([Flight(job(), 0, due, 0)])  # the holder publishes what it claimed
    late = Flight(job(), 0, due, 1)
    await b.run([late])
    assert late.outcome == "already_claimed"
    assert ledger_b.last[late.job.subject].watermark == due
    assert len(triggers.messages) == 1


async def test_a_tick_past_its_lateness_is_missed_not_published() -> None:
    claims, triggers = MemoryClaims(), MemoryTriggers()
    a, _, _ = dispatcher("a", claims, triggers)
    late = Flight(job(), 0, due_now() - 3_600_000, 0)
    await a.run([late])
    assert late.outcome == "missed"
    assert triggers.messages == []


async def test_a_tick_that_looks_late_by_a_clock_in_doubt_is_neither_missed_nor_published() -> None:
    """A server clock stepped ahead while the tick was claimed: it is tried again later (and
    decided once the clock is trusted), not counted missed and given up."""
    claims, triggers = MemoryClaims(), MemoryTriggers()
    a, host, _ = dispatcher("a", claims, triggers)
    host.clock_off = True
    late = Flight(job(), 0, due_now() - 3_600_000, 0)
    await a.run([late])
    assert late.outcome == "error" and late.outcome not in RESOLVED
    assert late.error is not None and "max_clock_skew" in late.error
    assert host.acted_on == [late]
    assert triggers.messages == []


def every_second() -> Job:
    spec = JobSpec(name="s", schedule="@every 1s", max_lateness=30)
    plan = spec.plan()
    return Job(spec, plan.schedule, plan, spec.trigger_subject("hrwcron.trigger"), 0, 1, 0)


async def test_a_tick_waits_while_a_live_replica_still_holds_an_earlier_one() -> None:
    """Replica a claimed the tick at ``due - 1 s`` and has not published it yet; b, which
    saw ``due - 2 s`` published and came to ``due`` (another route, a lost mark, a restart),
    must not publish ``due`` first: the fence would then refuse a's trigger for good and the
    tick would be lost. b turns back to the earlier tick (which it leaves to its live
    holder); once a has published it, b publishes ``due`` after it, in order."""
    claims, triggers = MemoryClaims(), MemoryTriggers()
    a, _, _ = dispatcher("a", claims, triggers)
    b, _, _ = dispatcher("b", claims, triggers)
    due = due_now()
    first = Flight(every_second(), 0, due - 2000, 0)
    await b.run([first])
    assert first.outcome == "started", first.error
    held = ClaimRecord(node="a", instance=a.instance, attempt=1, claimed_ms=due - 1000)
    assert await claims.create(TickId("s", due - 1000).claim_key, held, 30.0)
    reads = b.reads
    early = Flight(every_second(), 0, due, 0)
    await b.run([early])
    assert early.outcome == "lock_busy" and early.earlier == (due - 1000,)
    assert b.reads == reads + 1  # the one earlier tick's claim
    assert len(triggers.messages) == 1
    middle = Flight(every_second(), 0, due - 1000, 0)
    await a.run([middle])  # the holder publishes what it claimed
    assert middle.outcome == "started", middle.error
    again = Flight(every_second(), 0, due, 0)
    await b.run([again])
    assert again.outcome == "started", again.error
    ids = [m.headers["Nats-Msg-Id"] for m in triggers.messages]
    assert ids == [TickId("s", d).key for d in (due - 2000, due - 1000, due)]
    reads = b.reads
    after = Flight(every_second(), 0, due + 1000, 0)
    await b.run([after])
    assert after.outcome == "started", after.error
    assert b.reads == reads  # the tick before it is in the stream: nothing read


async def test_an_earlier_tick_claimed_by_a_holder_that_is_gone_is_taken_over_first() -> None:
    """Its holder died after claiming it: the later tick turns the job back to it, it is
    taken over and published, and then the later one: no tick lost, none out of order."""
    claims, triggers = MemoryClaims(), MemoryTriggers()
    b, host, _ = dispatcher("b", claims, triggers)
    host.live = False
    due = due_now()
    held = ClaimRecord(node="a", instance="a-gone", attempt=1, claimed_ms=due - 1000)
    assert await claims.create(TickId("s", due - 1000).claim_key, held, 30.0)
    tick = Flight(every_second(), 0, due, 0)
    await b.run([tick])
    assert tick.outcome == "lock_busy" and tick.earlier == (due - 1000,)
    assert triggers.messages == []
    earlier = Flight(every_second(), 0, due - 1000, 0)
    await b.run([earlier])
    assert earlier.outcome == "started", earlier.error
    assert b.replaces == 1  # taken over from the holder that is gone
    again = Flight(every_second(), 0, due, 0)
    await b.run([again])
    assert again.outcome == "started", again.error
    ids = [m.headers["Nats-Msg-Id"] for m in triggers.messages]
    assert ids == [TickId("s", d).key for d in (due - 1000, due)]


async def test_an_earlier_tick_resolved_on_its_claim_does_not_hold_a_later_one() -> None:
    """Skipped (overlap) or refused, recorded on the claim: the later tick goes straight on."""
    claims, triggers = MemoryClaims(), MemoryTriggers()
    b, _, _ = dispatcher("b", claims, triggers)
    due = due_now()
    skipped = ClaimRecord(
        node="a", instance="a-1", attempt=1, claimed_ms=due - 1000, outcome=Outcome.SKIPPED
    )
    assert await claims.create(TickId("s", due - 1000).claim_key, skipped, 30.0)
    tick = Flight(every_second(), 0, due, 0)
    await b.run([tick])
    assert tick.outcome == "started", tick.error
    assert tick.earlier == ()


async def test_a_gap_another_replica_filled_is_closed_by_reading_the_subject_not_claims() -> None:
    """b published ``due - 2 s`` and did not follow the subject while a published the next
    one (b a follower taking over): before ``due`` b reads the subject once, finds the gap
    filled, and reads no earlier claim."""
    claims, triggers = MemoryClaims(), MemoryTriggers()
    a, _, _ = dispatcher("a", claims, triggers)
    b, _, _ = dispatcher("b", claims, triggers)
    due = due_now()
    for replica, at in ((b, due - 2000), (a, due - 1000)):
        tick = Flight(every_second(), 0, at, 0)
        await replica.run([tick])
        assert tick.outcome == "started", tick.error
    reads = b.reads
    tick = Flight(every_second(), 0, due, 0)
    await b.run([tick])
    assert tick.outcome == "started", tick.error
    assert b.reads == reads and tick.earlier == ()
    ids = [m.headers["Nats-Msg-Id"] for m in triggers.messages]
    assert ids == [TickId("s", d).key for d in (due - 2000, due - 1000, due)]
