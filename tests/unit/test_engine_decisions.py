"""The tick decisions alone, wired to the real parts on the memory ports but with no Scheduler
and no loops running: the clock is driven by hand and each due tick is evaluated directly."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from harness.engine_parts import Clocks, State
from harness.observers import RecordingObserver
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryJobs, MemoryMembers, MemoryTriggers
from hrwcron.core.model import JobSpec
from hrwcron.core.outcomes import Outcome
from hrwcron.engine.clock import Clock
from hrwcron.engine.decisions import TickDecisions
from hrwcron.engine.flight import Flight
from hrwcron.engine.jobs import Job, JobTable
from hrwcron.engine.ledger import TriggerLedger
from hrwcron.engine.marks import MarksHeard
from hrwcron.engine.membership import Membership
from hrwcron.engine.ports import (
    HEADER_MSG_ID,
    HEADER_WATERMARK,
    JobEvent,
    LastTrigger,
    ServerTime,
)
from hrwcron.engine.run_counter import RunCounter
from hrwcron.engine.settings import Settings
from hrwcron.engine.timer import Timer


@dataclass
class Engine:
    clocks: Clocks
    ticks: TickDecisions
    table: JobTable
    ledger: TriggerLedger
    membership: Membership
    timer: Timer[Flight]
    observer: RecordingObserver
    submitted: list[list[Flight]]
    triggers: MemoryTriggers


def spawn(coro: object, name: str) -> asyncio.Task[None]:
    return asyncio.create_task(coro, name=name)  # type: ignore[arg-type]


async def engine(*, quiet: bool = False) -> Engine:
    """The engine's parts for replica "a", alone; ``quiet``: with progress marks (no feed)."""
    clocks = Clocks()
    clock = Clock(clocks.wall, clocks.monotonic)
    settings = Settings(node_id="a", member_ttl=3.0)
    observer = RecordingObserver()
    store = MemoryJobs()
    ticks = TickDecisions(
        settings,
        clock=clock,
        observer=observer,
        counter=RunCounter(None, spawn),
        jobs_store=store,
        spawn=spawn,
    )
    triggers = MemoryTriggers()
    ledger = TriggerLedger(triggers, observer=observer, newer=ticks.newer_trigger, retry_after=1.0)
    table = JobTable(
        settings, store, observer=observer, clock=clock, last=ledger.last, hooks=ticks, spawn=spawn
    )
    members = MemoryMembers(3.0, now=clocks.monotonic, server_clock=lambda: clocks.real_ms)
    membership = Membership(
        settings,
        members,
        instance="a-instance",
        observer=observer,
        clock=clock,
        state=State(),
        changed=ticks.membership_changed,
    )
    submitted: list[list[Flight]] = []
    timer: Timer[Flight] = Timer(
        table.jobs,
        clock,
        ready=lambda: membership.ready,
        evaluate=ticks.evaluate,
        submit=submitted.append,
    )
    ticks.attach(table, ledger, membership, timer)
    if quiet:
        ticks.use_marks(
            MarksHeard(
                step=settings.failover_step,
                lease=settings.claim_lease,
                monotonic=clock.monotonic,
                live=membership.holder_live,
                view=lambda: membership.view_id,
            )
        )
    await membership.join()
    membership.refresh()
    assert [c.node for c in membership.candidates] == ["a"]
    return Engine(clocks, ticks, table, ledger, membership, timer, observer, submitted, triggers)


def load(e: Engine, name: str = "j") -> Job:
    e.table.apply(JobEvent(name, JobSpec(name=name, schedule="@every 1m"), 1))
    job = e.table.jobs[name]
    assert job.due is not None
    assert e.timer.heap[-1][0] == job.due + job.jitter_ms  # the table's hook pushed it
    return job


def load_due(e: Engine) -> tuple[Job, int]:
    """A loaded job and the due instant of its first tick."""
    job = load(e)
    assert job.due is not None
    return job, job.due


def due_now(e: Engine, job: Job) -> float:
    assert job.due is not None
    e.clocks.advance(job.due + job.jitter_ms + 1 - e.clocks.real_ms)
    return e.clocks.real_ms


async def test_the_owner_acts_on_a_due_tick_once() -> None:
    e = await engine()
    job = load(e)
    acts: list[Flight] = []
    e.ticks.evaluate(job, due_now(e, job), True, acts)
    assert [(f.job, f.due, f.rank) for f in acts] == [(job, job.due, 0)]
    assert job.busy


def held_back(e: Engine, job: Job, now: float, earlier: tuple[int, ...]) -> Flight:
    """The job's due tick acted on, and held back by the dispatcher for ``earlier`` ticks
    claimed by another replica and not in the stream."""
    acts: list[Flight] = []
    e.ticks.evaluate(job, now, True, acts)
    [flight] = acts
    flight.outcome = Outcome.LOCK_BUSY
    flight.earlier = earlier
    e.ticks.acted(flight)
    return flight


async def test_a_tick_held_back_by_an_earlier_claimed_one_turns_the_job_back_to_it() -> None:
    """The job goes back to the earlier tick at once, and the mark may not pass it."""
    e = await engine()
    job, due = load_due(e)
    now = due_now(e, job)
    earlier = due - 30_000  # still inside its lateness window
    held_back(e, job, now, (earlier,))
    assert job.due == earlier and not job.busy and not job.acted
    assert e.ticks.owed["j"] == earlier + job.jitter_ms  # lowered from the later tick's
    assert e.timer.heap[-1][0] == now and e.timer.heap[-1][3] == job.entry  # decided at once
    assert e.observer.of("j") == [("lock_busy", due)]


async def test_an_earlier_claimed_tick_past_its_window_here_is_waited_out_not_decided() -> None:
    """Deciding it again would find it missed and come straight back to the later tick, in
    a loop: the later one waits until a replica max_clock_skew behind could not publish it."""
    e = await engine()
    job, due = load_due(e)
    now = due_now(e, job)
    lateness = job.spec.max_lateness_ms
    closed, still_open = int(now - lateness - 1), int(now - lateness + 500)
    held_back(e, job, now, (closed,))
    assert job.due == due
    assert e.timer.heap[-1][0] == closed + lateness + e.ticks.settings.max_clock_skew_ms + 1
    held_back(e, job, now, (closed, still_open))
    assert job.due == still_open  # the first one someone may still publish


async def test_a_replica_that_is_not_ready_looks_again_without_acting() -> None:
    e = await engine()
    job = load(e)
    acts: list[Flight] = []
    entry = job.entry
    e.ticks.evaluate(job, due_now(e, job), False, acts)
    assert acts == [] and not job.busy
    assert job.entry == entry + 1 and e.timer.heap[-1][3] == job.entry  # pushed again


async def test_a_tick_already_in_the_stream_is_resolved_and_the_next_one_planned() -> None:
    e = await engine()
    job, due = load_due(e)
    e.ledger.remember(job.subject, LastTrigger(7, "j:x", due))
    assert e.observer.of("j") == [("not_owner", due)]
    assert job.due == due + 60_000


async def test_a_tick_past_its_lateness_is_counted_missed_by_its_owner() -> None:
    e = await engine()
    job, due = load_due(e)
    now = due_now(e, job) + job.spec.max_lateness_ms + 1
    e.ticks.evaluate(job, now, True, [])
    assert e.observer.of("j") == [("missed", due)]
    assert e.ticks.missed_recently.total(now) == 1


async def past_lateness_quietly(e: Engine, job: Job) -> float:
    """Evaluate the job's tick past its lateness window (on every replica's clock) on a quiet
    replica, until the read of its subject that decides it is done."""
    due_now(e, job)
    e.clocks.advance(job.spec.max_lateness_ms + e.ticks.settings.max_clock_skew_ms + 1)
    now = e.clocks.real_ms
    e.ticks.evaluate(job, now, True, [])
    checker = e.ticks._checker
    assert checker is not None and job.busy  # off the timer until its subject is read
    await checker
    return now


async def test_quiet_a_late_tick_another_replica_published_is_not_missed() -> None:
    e = await engine(quiet=True)
    job, due = load_due(e)
    # Published by another replica while this one was paused: a quiet replica never saw it.
    headers = {HEADER_MSG_ID: f"j:{due}", HEADER_WATERMARK: str(due)}
    await e.triggers.publish(job.subject, b"{}", headers, 0)
    now = await past_lateness_quietly(e, job)
    assert e.observer.of("j") == [("not_owner", due)]
    assert e.ticks.missed_recently.total(now) == 0
    assert job.due == due + 60_000 and not job.busy


async def test_quiet_a_tick_past_its_lateness_the_stream_does_not_hold_is_missed() -> None:
    """Read once its window has closed for every replica, the subject's answer is final."""
    e = await engine(quiet=True)
    job, due = load_due(e)
    now = await past_lateness_quietly(e, job)
    assert e.observer.of("j") == [("missed", due)]
    assert e.ticks.missed_recently.total(now) == 1
    assert job.due == due + 60_000 and not job.busy


async def test_quiet_a_tick_just_past_its_window_is_read_again_once_none_may_publish() -> None:
    """Just past its window by this replica's clock, another replica's clock may still be
    inside it: the subject is read again after the clock skew replicas may have, not counted."""
    e = await engine(quiet=True)
    job, due = load_due(e)
    now = due_now(e, job) + job.spec.max_lateness_ms + 1
    e.clocks.advance(job.spec.max_lateness_ms + 1)
    e.ticks.evaluate(job, now, True, [])
    checker = e.ticks._checker
    assert checker is not None
    await checker
    assert e.observer.of("j") == [] and job.due == due and not job.busy
    skew_ms = e.ticks.settings.max_clock_skew_ms
    assert e.timer.heap[-1][0] == due + job.spec.max_lateness_ms + skew_ms + 1


async def test_holding_a_share_the_mark_stays_below_a_job_whose_subject_is_being_read() -> None:
    """Its first tick is not on the timer until its subject is read: the progress mark must not
    vouch for it meanwhile, nor for a tick still being checked before it is counted missed."""
    e = await engine(quiet=True)
    answer = asyncio.Event()
    asked: list[list[str]] = []

    async def read(subjects: list[str], timeout: float) -> None:
        asked.append(subjects)
        await answer.wait()

    e.ticks.read_before_planning(read)
    e.table.apply(JobEvent("j", JobSpec(name="j", schedule="@every 1m"), 1))
    job = e.table.jobs["j"]
    assert job.due is not None and e.timer.heap == []  # waiting for its read, off the timer
    fire = job.due + job.jitter_ms
    later = fire + 3_600_000
    assert e.ticks.resolved_ms(later) == fire - 1
    answer.set()
    await e.ticks.planned.wait()
    assert asked == [[job.subject]]
    assert e.timer.heap[-1][0] == fire  # planned: the timer holds the mark back from now on
    e.timer.heap.clear()
    assert e.ticks.resolved_ms(later) == later


def server_ahead(e: Engine, ms: float) -> None:
    """The members leader's clock, as this replica measures it, is ``ms`` ahead of true time."""
    local = e.clocks.wall()
    e.ticks.clock.estimator.add(ServerTime(local, local + ms, local))


async def test_a_tick_past_its_window_only_by_a_clock_that_is_off_fires_once_it_is_right() -> None:
    """The server's clock steps 90 s ahead: by it the due tick is past its 60 s window, but the
    replica does not trust it (not ready) and decides nothing. Set right again, the tick is
    still inside its window and is fired, late, instead of never."""
    e = await engine()
    job, due = load_due(e)
    due_now(e, job)
    server_ahead(e, 90_000)
    now = e.ticks.clock.now_ms()
    assert now > due + job.spec.max_lateness_ms and not e.membership.ready
    entry = job.entry
    e.ticks.evaluate(job, now, False, [])
    assert e.observer.of("j") == [] and job.due == due
    assert job.entry == entry + 1  # off the timer: no wake-up on a clock that is off
    server_ahead(e, 0)
    e.ticks.membership_changed(readiness=True, candidates=False)  # ready again
    assert (0, "j", job.entry) in [(w[0], w[2], w[3]) for w in e.timer.heap]  # at once
    acts: list[Flight] = []
    e.ticks.evaluate(job, e.ticks.clock.now_ms(), True, acts)
    assert [(f.job, f.due) for f in acts] == [(job, due)]


async def test_not_ready_with_a_clock_it_trusts_a_replica_resolves_a_tick_past_its_window() -> None:
    e = await engine()
    job, due = load_due(e)
    now = due_now(e, job) + job.spec.max_lateness_ms + 1
    e.ticks.evaluate(job, now, False, [])  # not ready, and another replica's tick
    assert job.due == due + 60_000


def owed_since(e: Engine, spec: JobSpec) -> tuple[int, int]:
    """Put ``spec``'s newest trigger two ticks (10 s apart) behind true time in the ledger, so
    that the two ticks after it are owed and inside their lateness window. (the trigger's due,
    the first owed tick)."""
    done = int(e.clocks.real_ms // 10_000 * 10_000 - 20_000)
    subject = spec.trigger_subject(Settings(node_id="a").subject_prefix)
    e.ledger.remember(subject, LastTrigger(7, f"{spec.name}:{done}", done))
    return done, done + 10_000


async def test_a_job_loaded_while_the_server_clock_is_stepped_ahead_keeps_its_owed_ticks() -> None:
    """A replica (re)starting while the members leader's clock is 90 s ahead: by that clock the
    ticks after the stream's newest trigger are past their 60 s window. The replica is not
    ready and decides nothing, but where it starts tracking the job must not pass them over,
    or a tick it fires later (once the clock is right) fences them out of the stream."""
    e = await engine()
    spec = JobSpec(name="j", schedule="@every 10s")
    _, owed = owed_since(e, spec)
    server_ahead(e, 90_000)
    assert e.ticks.clock.now_ms() > owed + spec.max_lateness_ms and not e.membership.ready
    e.table.apply(JobEvent("j", spec, 1))
    assert e.table.jobs["j"].due == owed


async def test_catch_up_latest_with_the_server_clock_stepped_ahead_keeps_the_latest_owed_tick() -> (
    None
):
    e = await engine()
    spec = JobSpec(name="j", schedule="@every 10s", catchup="latest")
    _, owed = owed_since(e, spec)
    server_ahead(e, 90_000)
    e.table.apply(JobEvent("j", spec, 1))
    job = e.table.jobs["j"]
    assert job.due == owed + 10_000  # the newest at or before true time, not 90 s later
    assert job.due <= e.clocks.real_ms
