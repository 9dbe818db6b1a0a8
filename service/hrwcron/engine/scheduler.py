"""The replica engine: the parts of a replica put together, and its lifecycle.

A tick (job J, nominal due T) is resolved once it is in the trigger stream, was skipped, or
passed ``T + max_lateness``. Each replica walks every job's ticks in due order and never looks
at a later tick before the earlier one is resolved; that, plus subject-sequence fencing on the
publish, is what keeps a job's triggers in due order and a zombie from overtaking anything.

The parts, each in its own module: membership.py (heartbeats, readiness, ranking), jobs.py
(the job table and its watch), ledger.py (the newest trigger per subject), timer.py (the heap),
decisions.py (what a due tick needs), dispatch.py (claims and publishes). This module puts them
together, runs the replica's lifecycle and answers the admin service's questions.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import uuid
from collections.abc import Coroutine, Iterable
from typing import Any

from hrwcron.core import hrw
from hrwcron.core.errors import HrwcronError, NotFoundError
from hrwcron.core.outcomes import PUBLISHED, Outcome
from hrwcron.core.plan import Allowance, lifecycle
from hrwcron.core.turns import Candidate, ranking
from hrwcron.engine.clock import Clock
from hrwcron.engine.decisions import TickDecisions
from hrwcron.engine.dispatch import Dispatcher
from hrwcron.engine.failpoints import Failpoints
from hrwcron.engine.flight import Flight
from hrwcron.engine.jobs import JobTable
from hrwcron.engine.ledger import TriggerLedger
from hrwcron.engine.marks import MARKS_PER_STEP, Mark, MarksHeard
from hrwcron.engine.membership import Membership
from hrwcron.engine.ports import (
    ClaimsPort,
    CountsPort,
    JobsPort,
    MarksPort,
    MembersPort,
    Observer,
    RunsPort,
    StoreUnavailable,
    TriggersPort,
)
from hrwcron.engine.queries import Progress
from hrwcron.engine.run_counter import RunCounter
from hrwcron.engine.settings import Settings
from hrwcron.engine.timer import Timer
from hrwcron.engine.view import MembershipView

__all__ = ["Progress", "Scheduler", "Settings"]

log = logging.getLogger("hrwcron.scheduler")


class Scheduler:
    """One replica's engine: the facade the process and the tests use; the admin service and
    the console see it as :class:`~hrwcron.engine.queries.EngineQueries`."""

    def __init__(
        self,
        settings: Settings,
        *,
        members: MembersPort,
        claims: ClaimsPort,
        triggers: TriggersPort,
        jobs: JobsPort,
        observer: Observer,
        runs: RunsPort | None = None,
        counts: CountsPort | None = None,
        marks: MarksPort | None = None,
        clock: Clock | None = None,
        failpoints: Failpoints | None = None,
    ) -> None:
        self.settings = settings
        self.node = settings.node_id
        self.instance = uuid.uuid4().hex
        self.clock = clock or Clock()
        self._triggers = triggers
        self._jobs_store = jobs
        self._counter = RunCounter(counts, self._spawn)
        self._observer = observer
        self._tasks: set[asyncio.Task[Any]] = set()
        # Jobs per owner as of the last recount, and how many jobs that recount saw: what
        # operators see besides the running jobs (the rest of those had no owner).
        self.owned_counts: dict[str, int] = {}
        self.counted_jobs = 0
        # Of the jobs this replica lists in a status merged from every member's share.
        self.listed_owned_counts: dict[str, int] = {}
        self.listed_jobs = 0
        self._ticks = ticks = TickDecisions(
            settings,
            clock=self.clock,
            observer=observer,
            counter=self._counter,
            jobs_store=jobs,
            spawn=self._spawn,
        )
        self.missed_recently = ticks.missed_recently
        self._ledger = TriggerLedger(
            triggers,
            observer=observer,
            newer=ticks.newer_trigger,
            retry_after=settings.heartbeat_interval,
        )
        self.last = self._ledger.last
        self._table = JobTable(
            settings,
            jobs,
            observer=observer,
            clock=self.clock,
            last=self.last,
            hooks=ticks,
            spawn=self._spawn,
        )
        self.jobs = self._table.jobs
        self.skipped = self._table.skipped
        self._membership = Membership(
            settings,
            members,
            instance=self.instance,
            observer=observer,
            clock=self.clock,
            state=self,
            changed=ticks.membership_changed,
            held=self._table.hold,
        )
        self.view: MembershipView = self._membership.view
        self.failed = self._membership.failed  # set with ``fatal``: the process should exit
        self._dispatcher = Dispatcher(
            ticks,
            settings,
            claims=claims,
            triggers=triggers,
            runs=runs,
            ledger=self._ledger,
            counter=self._counter,
            observer=observer,
            clock=self.clock,
            failpoints=failpoints or Failpoints({}),
            instance=self.instance,
        )
        self._queued_acts = self._dispatcher.queued
        self._timer: Timer[Flight] = Timer(
            self.jobs,
            self.clock,
            ready=lambda: self.ready,
            evaluate=ticks.evaluate,
            submit=self._dispatcher.submit,
        )
        ticks.attach(self._table, self._ledger, self._membership, self._timer)
        self.runs_done = ticks.runs_done
        self.holder_live = self._membership.holder_live
        self._marks = marks
        if marks is not None:
            ticks.use_marks(
                MarksHeard(
                    step=settings.failover_step,
                    lease=settings.claim_lease,
                    monotonic=self.clock.monotonic,
                    live=self.holder_live,
                    view=lambda: self._membership.view_id,
                )
            )

    # ------------------------------------------------------------ what the parts ask for

    @property
    def stopping(self) -> bool:
        return self._ticks.stopping

    @property
    def loading(self) -> bool:
        return not self._table.loaded.is_set() or not self._ledger.loaded.is_set()

    @property
    def digest(self) -> str:
        """The digest of the job table, compared between replicas; empty when each holds
        its own share (two shares have no digest in common)."""
        return "" if self.settings.holders > 0 else f"{self._table.digest:016x}"

    @property
    def job_count(self) -> int:
        return len(self.jobs)

    @property
    def fatal(self) -> HrwcronError | None:
        return self._membership.fatal

    @property
    def not_ready_reason(self) -> str:
        """Empty when this replica may claim; otherwise why it must not (fail closed)."""
        return self._membership.not_ready_reason

    @property
    def ready(self) -> bool:
        return not self._membership.not_ready_reason

    @property
    def _candidates(self) -> list[Candidate]:
        return self._membership.candidates

    async def reset_runs(self, name: str, subject: str) -> None:
        """Start a deleted job's run count again, so a job created anew under the same name
        gets all of its runs."""
        last = await self._triggers.last(subject)
        await self._counter.reset(name, last.run if last else 0)

    # ------------------------------------------------------------------ claim and publish

    async def publish_unscheduled(
        self, name: str, msg_id: str, due_ms: int, kind: str, claim_key: str
    ) -> Outcome:
        """Fire ``name`` outside its schedule (``manual`` or ``backfill``) through the same
        claim and fenced publish as a tick. Returns ``started``, ``duplicate`` (this Msg-Id was
        claimed or published before), ``rejected`` (the server refused the trigger) or
        ``lock_busy``; raises NotFoundError for a bad name and StoreUnavailable when NATS did
        not answer. A trigger that was not published gives its claim back, so the retry the
        caller is advised to make can take it."""
        job = self.jobs.get(name)
        if job is None:
            raise NotFoundError(f"no job named {name!r}")
        flight = Flight(job, job.entry, due_ms, 0, kind, msg_id, claim_key)
        await self._dispatcher.run([flight])
        outcome = flight.outcome
        assert outcome is not None  # a run resolves every flight it was given
        if flight.revision and outcome not in PUBLISHED:
            # Even after a timeout: if the trigger did land, its Msg-Id and the stream check
            # before a retry keep that retry from publishing it again.
            with contextlib.suppress(Exception):
                await self._dispatcher.claims.release(claim_key, flight.revision)
        self._observer.outcome(name, outcome, due_ms=due_ms, rank=0, attempt=1, lateness_ms=None)
        if outcome == Outcome.ERROR:
            raise StoreUnavailable(f"trigger {msg_id}: {flight.error}")
        return outcome

    async def refresh_last(self, names: Iterable[str]) -> None:
        """Bring the newest trigger of these jobs up to date from the stream, for reading
        them out: a replica that does not follow the stream knows its own triggers only."""
        if self._marks is None:
            return  # following the stream: up to date already
        # Its own jobs' newest triggers are this replica's own publishes: known already.
        subjects = [
            job.subject
            for name in names
            if (job := self.jobs.get(name)) is not None and job.first != self.node
        ]
        if not subjects:
            return
        try:
            await self._ledger.read(subjects, 10)
        except Exception as exc:  # unread, what this replica knows stands
            log.debug("reading the newest triggers of %d jobs failed: %s", len(subjects), exc)

    def problem_of(self, name: str) -> str:
        job = self.jobs.get(name)
        return job.problem if job is not None else ""

    # ------------------------------------------------------------------------ lifecycle

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._on_task_done)
        return task

    def _on_task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("%s crashed: %r", task.get_name(), task.exception())

    async def start(self) -> None:
        """Join the membership and start every loop; returns once the replica is running.
        A start that fails stops every loop it began and leaves the membership again, so the
        process can try again from nothing (a start-up retry, see process/startup.py)."""
        try:
            await self._start()
        except BaseException:
            await _cancel_all(list(self._tasks), 1.0)
            if self._membership.registered:
                # Left, or the next attempt waits a member TTL for this one's key to expire;
                # never a key this replica did not create (a live replica's, same node id).
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._membership.leave(), timeout=0.5)
            raise

    async def _start(self) -> None:
        gc.freeze()  # what the process set up so far stays too: no full collection walks it
        membership = self._membership
        await membership.join()
        membership.refresh()  # the lanes to hold, before the jobs watch starts reading them
        # Membership first: loading a large job set can outlast the member TTL.
        self._spawn(membership.watch(), "members-watch")
        self._spawn(membership.refresh_loop(), "members-refresh")
        self._spawn(membership.heartbeat_loop(), "heartbeat")
        # Holding a share with progress marks, each job's newest trigger is read as the job
        # is loaded: the replica reads and holds its share's subjects, not every subject.
        held_only = self.settings.holders > 0 and self._marks is not None
        if held_only:
            self._ticks.read_before_planning(self._ledger.read)
        else:
            self._spawn(self._ledger.follow(live=self._marks is None), "trigger-feed")
            await _wait_event(self._ledger.loaded, 30, "trigger history")
        if self.settings.holders > 0:
            await membership.settle()
        self._table.start_watch()
        await self._wait_loaded()
        if held_only:
            # Bounded: a read that fails or outlasts READ_TIMEOUT_S leaves every job still
            # waiting to the fence.
            await self._ticks.planned.wait()
            self._ledger.loaded.set()
        self._spawn(self._table.guard(), "jobs-watch-guard")
        self._spawn(self._timer.run(), "timer")
        self._spawn(self._owned_loop(), "owned-count")
        if self._marks is not None:
            self._spawn(self._hear_marks(self._marks), "marks-follow")
            self._spawn(self._announce_marks(self._marks), "marks-announce")
        membership.refresh()

    async def _wait_loaded(self) -> None:
        """Until the job list is read, as long as it keeps arriving: a million jobs on two
        cores take longer than a silent store should be waited for."""
        table = self._table
        seen = -1
        while seen != table.applied:
            seen = table.applied
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(table.loaded.wait(), LOAD_SILENCE_S)
                return
        raise StoreUnavailable(
            f"timed out loading the job list: nothing arrived for {LOAD_SILENCE_S:g} s "
            f"({table.applied} changes read)"
        )

    async def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, let in-flight publishes finish, then leave the membership; all of
        it within ``timeout`` (``shutdown_timeout``), whatever state the connection is in."""
        timeout = self.settings.shutdown_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def left(most: float) -> float:
            return max(0.05, min(most, deadline - loop.time()))

        self._ticks.stopping = self._table.stopping = self._ledger.stopping = True
        with contextlib.suppress(Exception):
            # Announce "not ready" at once, so the others stop waiting for this replica's turn.
            await asyncio.wait_for(self._membership.beat(), timeout=left(min(1.0, timeout / 4)))
        self._queued_acts.clear()
        batches = self._dispatcher.tasks
        if batches:
            # Keep a second for cancelling the rest and leaving the membership.
            await asyncio.wait(set(batches), timeout=left(deadline - loop.time() - 1.0))
        await _cancel_all([*self._tasks, *batches], left(0.5))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._membership.leave(), timeout=left(0.5))

    async def _announce_marks(self, marks: MarksPort) -> None:
        """Every quarter step: look again at ticks parked on owners that fell silent, and say
        how far this replica has got with its own (only while it may claim)."""
        ticks = self._ticks
        interval = self.settings.failover_step / MARKS_PER_STEP
        while True:
            await asyncio.sleep(interval)
            ticks.release_parked()
            if not self.ready or ticks.stopping or self._table.catching_up:
                continue  # still reading lanes it took on: it cannot vouch for their ticks
            mark = Mark(
                node=self.node,
                instance=self.instance,
                resolved_ms=ticks.resolved_ms(self.clock.now_ms()),
                resolved=ticks.resolved,
                jobs_revision=self._table.revision,
                view=self._membership.view_id,
            )
            try:
                await marks.announce(mark)
            except Exception as exc:  # the heartbeat says more; followers then act themselves
                log.debug("announcing a progress mark failed: %s", exc)

    async def _hear_marks(self, marks: MarksPort) -> None:
        while not self._ticks.stopping:
            try:
                async for mark in marks.follow():
                    if mark.node != self.node:
                        self._ticks.heard(mark)
            except Exception as exc:
                log.warning("progress marks stopped (%s); following them again", exc)
            await asyncio.sleep(self.settings.heartbeat_interval)

    async def _owned_loop(self) -> None:
        """Counts owned jobs after membership or job changes, in slices, so even 100,000 jobs
        neither stall the loop nor cost CPU while nothing changes."""
        while True:
            await self._ticks.owned_dirty.wait()
            self._ticks.owned_dirty.clear()
            if self.settings.holders > 0:
                await self._count_owned_in_lanes()
            else:
                await self._count_owned_by_ranking()
            await asyncio.sleep(1.0)  # coalesce bursts of changes into one recount

    async def _count_owned_by_ranking(self) -> None:
        """Every job held: its owner is the first of its ranking over the ready members."""
        candidates = self._membership.candidates
        plain = [c.node for c in candidates] if all(c.weight == 1.0 for c in candidates) else []
        owners: collections.Counter[str] = collections.Counter()
        jobs = list(self.jobs.values())
        for start in range(0, len(jobs), 500):
            chunk = jobs[start : start + 500]
            untagged = [j.spec.name for j in chunk if not j.spec.tags] if plain else []
            if untagged:
                owners.update(hrw.owners(untagged, plain).values())
            for job in chunk:
                if plain and not job.spec.tags:
                    continue
                order = ranking(job.spec.name, job.spec.tags, candidates)
                if order:
                    owners[order[0]] += 1
            await asyncio.sleep(0)
        self.owned_counts = dict(owners)
        self.counted_jobs = len(jobs)
        self.listed_owned_counts, self.listed_jobs = self.owned_counts, self.counted_jobs
        self._observer.owned(owners[self.node])

    async def _count_owned_in_lanes(self) -> None:
        """Holding a share: the owner of each held job is the first ready holder of its lane,
        as the engine places it. Besides, the owners of the jobs this replica lists (of the
        lanes it is the first live holder of), which summed over the members count each job
        once."""
        owners: collections.Counter[str] = collections.Counter()
        listed: collections.Counter[str] = collections.Counter()
        listed_jobs = 0
        jobs = list(self.jobs.values())
        membership = self._membership
        for index, job in enumerate(jobs):
            membership.place(job)
            lists = membership.first_holder(job.lane) == self.node
            listed_jobs += lists
            if job.first is not None:
                owners[job.first] += 1
                if lists:
                    listed[job.first] += 1
            if index % 500 == 499:
                await asyncio.sleep(0)
        self.owned_counts, self.counted_jobs = dict(owners), len(jobs)
        self.listed_owned_counts, self.listed_jobs = dict(listed), listed_jobs
        self._observer.owned(owners[self.node])

    # --------------------------------------------------------------------------- status

    @property
    def jobs_revision(self) -> int:
        """The newest jobs-bucket revision this replica's watch has applied."""
        return self._table.revision

    def job_on_subject(self, subject: str) -> str | None:
        """The loaded job that publishes on ``subject``, if any."""
        return self._table.by_subject.get(subject)

    @property
    def members_generation(self) -> int:
        """Bumped whenever the ready or the live members change."""
        return self._membership.generation

    @property
    def live_nodes(self) -> list[str]:
        """Every live member, ready or not, this replica included."""
        return self._membership.live_nodes

    def lists(self, name: str) -> bool:
        """Whether this replica lists the job in a listing merged from every member's share:
        it is the first live holder of the job's lane (of the tagged lane, the first live
        member)."""
        lane = self._table.lane_of(name)
        if lane is None:
            return False
        return self._membership.first_holder(lane) == self.node

    @property
    def held_lanes(self) -> frozenset[str] | None:
        """The lanes of jobs this replica holds; None: it holds every job."""
        return self._table.held

    def ranking_of_lane(self, name: str, lane: str) -> list[str]:
        """Who fires a job of ``lane`` first: its lane's ready holders in the job's order."""
        return self._membership.order_in_lane(name, lane)

    def ranking_of(self, name: str) -> list[str]:
        job = self.jobs.get(name)
        return self._membership.ranking_of(name, job.spec.tags if job else [])

    def progress(self, name: str, allowance: Allowance | None = None) -> Progress:
        """Where a job stands: its state, the next tick that fires (excluded ones passed
        over, searched on ``allowance``, which a request shares between its jobs), and for
        max_runs its runs so far and left (None while the count is unread)."""
        job = self.jobs[name]
        done = self.runs_done(name) if job.spec.max_runs is not None else None
        left = None if done is None else max(0, (job.spec.max_runs or 0) - done)
        current = self.due_of(name)
        due = None if job.spec.paused or left == 0 else current
        if due is not None and job.plan.excluded(due):
            due = (allowance or Allowance()).search(job.plan, due).due
        state = lifecycle(
            job.plan,
            paused=job.spec.paused,
            due=None if left == 0 else current,
            now_ms=self.clock.now_ms(),
            runs_left=left,
        )
        return Progress(state, due, done, left)

    def due_of(self, name: str) -> int | None:
        """The job's first unresolved tick as this replica knows it (None: not held here): a
        job left to its owner is not advanced tick by tick here, so its owner's newest mark
        says how far it got."""
        job = self.jobs.get(name)
        if job is None:
            return None
        mark = self._ticks.parked_on(job)
        if mark is None or mark.jobs_revision < job.revision:
            return job.due
        return self._ticks.next_unresolved(job, mark)


async def _cancel_all(tasks: list[asyncio.Task[Any]], timeout: float) -> None:
    """Cancel ``tasks`` and wait for them, cancelling again any that swallowed it (library
    cleanup code can turn a cancellation into another error), at most ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    pending = {task for task in tasks if not task.done()}
    while pending and loop.time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=min(0.1, deadline - loop.time()))
    if pending:
        names = ", ".join(sorted(task.get_name() for task in pending))
        log.warning("%d tasks did not stop in time: %s", len(pending), names)


# How long the job list may deliver nothing before start-up gives up on it: a large one keeps
# delivering for longer than this, and is waited for as long as it does.
LOAD_SILENCE_S = 60.0


async def _wait_event(event: asyncio.Event, timeout: float, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        # The store's answer, not a fault of this replica: start-up may try again.
        raise StoreUnavailable(f"timed out after {timeout:g} s loading the {what}") from None
