"""The replica engine: the life of a tick, and the parts of a replica put together.

A tick (job J, nominal due T) is resolved once it is in the trigger stream, was skipped, or
passed ``T + max_lateness``. Each replica walks every job's ticks in due order and never looks
at a later tick before the earlier one is resolved; that, plus subject-sequence fencing on the
publish, is what keeps a job's triggers in due order and a zombie from overtaking anything.

The parts: membership.py (heartbeats, readiness, ranking), jobs.py (the job table and its
watch), ledger.py (the newest trigger per subject), timer.py (the heap), dispatch.py (claims
and publishes). This module decides what a due tick needs and runs the replica's lifecycle;
it is longer than the others because the tick decisions are one state machine read top to
bottom.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import logging
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

from hrwcron.core import hrw
from hrwcron.core.errors import ConflictError, HrwcronError, NotFoundError
from hrwcron.core.model import JobSpec
from hrwcron.core.plan import STATUS_SEARCH_BUDGET, lifecycle
from hrwcron.core.planner import Candidate, collapse_latest, next_wake, ranking
from hrwcron.core.ticks import TickId
from hrwcron.engine.clock import Clock
from hrwcron.engine.counting import RunCounter
from hrwcron.engine.dispatch import Dispatcher
from hrwcron.engine.failpoints import Failpoints
from hrwcron.engine.flight import Flight
from hrwcron.engine.jobs import Job, JobTable
from hrwcron.engine.ledger import TriggerLedger
from hrwcron.engine.membership import Membership
from hrwcron.engine.ports import (
    ClaimsPort,
    CountsPort,
    JobsPort,
    LastTrigger,
    MembersPort,
    Observer,
    RunsPort,
    StoreUnavailable,
    TriggersPort,
)
from hrwcron.engine.recent import RecentCounts
from hrwcron.engine.settings import Settings
from hrwcron.engine.timer import Timer
from hrwcron.engine.view import MembershipView

__all__ = ["RESOLVED", "Progress", "Scheduler", "Settings"]

log = logging.getLogger("hrwcron.scheduler")

RESOLVED = frozenset(
    {
        "started",
        "duplicate",
        "already_claimed",
        "not_owner",
        "missed",
        "fenced",
        "skipped",
        "excluded",
        "max_runs",
        "rejected",
    }
)


@dataclass(frozen=True, slots=True)
class Progress:
    state: str  # see plan.lifecycle
    next_due: int | None  # the next tick that fires
    runs_done: int | None
    runs_left: int | None


class Scheduler:
    """One replica's engine: the facade the admin service, the process and the tests use."""

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
        self._stopping = False
        self._owned_dirty = asyncio.Event()
        self._awaiting_turn: set[str] = set()  # due ticks waiting for a later failover turn
        self._awaiting_holder: set[str] = set()  # due ticks whose claim another replica holds
        self._step_ms = int(settings.failover_step * 1000)
        # What operators see besides the running jobs: jobs per owner as of the last recount,
        # ticks that passed their lateness window unpublished (whoever owned them).
        self.owned_counts: dict[str, int] = {}
        self.missed_recently = RecentCounts()
        self._ledger = TriggerLedger(
            triggers,
            observer=observer,
            newer=self._newer_trigger,
            retry_after=settings.heartbeat_interval,
        )
        self.last = self._ledger.last
        self._table = JobTable(
            settings,
            jobs,
            observer=observer,
            clock=self.clock,
            last=self.last,
            hooks=self,
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
            changed=self._membership_changed,
        )
        self.view: MembershipView = self._membership.view
        self.failed = self._membership.failed  # set with ``fatal``: the process should exit
        self._dispatcher = Dispatcher(
            self,
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
            evaluate=self._evaluate,
            submit=self._dispatcher.submit,
        )
        # The parts' hot methods, bound once: a tick pays no more lookups than before.
        self._push = self._timer.push
        self._place = self._membership.place
        self._ledger_done = self._ledger.done
        self._holder_wait = self._membership.holder_wait
        self.holder_live = self._membership.holder_live

    # ------------------------------------------------------------ what the parts ask for

    @property
    def stopping(self) -> bool:
        return self._stopping

    @property
    def loading(self) -> bool:
        return not self._table.loaded.is_set() or not self._ledger.loaded.is_set()

    @property
    def digest(self) -> str:
        return f"{self._table.digest:016x}"

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

    def _membership_changed(self, readiness: bool, candidates: bool) -> None:
        if readiness:
            self._timer.wakeup.set()
        if not candidates:
            return
        self._owned_dirty.set()
        # A member left or stopped being ready: ticks waiting for a later failover turn
        # may now be ours to fire, so look at them again instead of at their old turn.
        # So may ticks whose claim holder just left or stopped being ready.
        for name in self._awaiting_turn | self._awaiting_holder:
            waiting = self.jobs.get(name)
            if waiting is not None and not waiting.busy:
                self._push(waiting, 0)
        self._awaiting_turn.clear()
        self._awaiting_holder.clear()

    # JobHooks: what a change of the job table means for the ticks.

    def prepare(self, job: Job) -> None:
        self._collapse(job)

    def loaded(self, job: Job) -> None:
        self._owned_dirty.set()
        if job.due is not None:
            if job.spec.max_runs is not None:
                self._read_count(job)
            self._push(job, job.due + job.jitter_ms)
        elif not job.spec.paused:
            self._ran_out(job)

    def runs_unknown(self, name: str) -> None:
        self._counter.forget(name)

    def _newer_trigger(self, subject: str, seen: LastTrigger) -> None:
        name = self._table.by_subject.get(subject)
        job = self.jobs.get(name) if name else None
        if job is None:
            return
        if job.spec.max_runs is not None:
            self._mirror_count(job)
        if job.busy or self._stopping:
            return
        due = job.due
        if due is not None and seen.watermark >= due:
            # The tick it waits for is in the stream: resolved here and now, without a
            # trip through the timer (every replica sees every trigger go by).
            self._finish(job, "already_claimed" if job.acted else "not_owner", due, -1, 0)

    # --------------------------------------------------------------------- a due tick

    def _evaluate(self, job: Job, now: float, ready: bool, acts: list[Flight]) -> None:
        due = job.due
        if self._stopping:
            return
        if due is None:
            self._delete_when_due(job, now, ready)
            return
        if self._ledger_done(job.subject, due):
            self._finish(job, "already_claimed" if job.acted else "not_owner", due, -1, 0)
            return
        if job.spec.max_runs is not None and self._out_of_runs(job, now):
            return
        self._place(job)
        owner = job.first
        if owner != job.owner:
            if job.owner is not None:
                self._observer.owner_changed(job.spec.name, job.owner, owner)
            job.owner = owner
        if job.plan.exclusions and job.plan.excluded(due):
            # Never fired, late or otherwise; counted once, by the owner, like a missed tick.
            counts = owner == self.node or (owner is None and ready)
            self._finish(job, "excluded" if counts else "not_owner", due, -1, 0, count=counts)
            return
        if now > due + job.spec.max_lateness_ms:
            counts = owner == self.node or (owner is None and ready)
            if not counts:
                self.missed_recently.add(now)  # the owner's own count is taken in _finish
            self._finish(job, "missed" if counts else "not_owner", due, -1, 0, count=counts)
            return
        rank = job.my_rank
        if not ready or rank < 0:
            # Fail closed: look again when the tick might be done, or our readiness returns.
            self._push(job, min(now + 250, due + job.spec.max_lateness_ms + 1))
            return
        fire = due + job.jitter_ms
        wake = next_wake(now, fire, rank, self._step_ms)
        if wake is not None:
            if now >= fire:
                self._awaiting_turn.add(job.spec.name)
            self._push(job, wake)
            return
        self._awaiting_turn.discard(job.spec.name)
        held = job.claim_seen
        if held is not None:
            # Another instance holds this tick's claim: wait for the trigger in the feed or for
            # the holder to fall silent, without reading the claim again meanwhile.
            wait_until = self._holder_wait(held)
            if wait_until is not None:
                self._awaiting_holder.add(job.spec.name)
                self._push(job, min(wait_until, due + job.spec.max_lateness_ms + 1))
                return
        self._awaiting_holder.discard(job.spec.name)
        job.busy = True
        acts.append(Flight(job, job.entry, due, rank))

    def acted(self, flight: Flight) -> None:
        """A tick's act ended with ``flight.outcome``: resolve it, or look again later."""
        job = flight.job
        job.busy = False
        if job.entry != flight.entry or self.jobs.get(job.spec.name) is not job:
            return  # the job changed or was removed meanwhile
        outcome, due, rank, attempt = flight.outcome, flight.due, flight.rank, flight.attempt
        if outcome in RESOLVED:
            self._finish(job, outcome, due, rank, attempt)
            return
        self._observer.outcome(
            job.spec.name, outcome, due_ms=due, rank=rank, attempt=attempt, lateness_ms=None
        )
        retry = self.clock.now_ms() + 250.0
        held = job.claim_seen
        if outcome == "lock_busy" and held is not None:
            wait_until = self._holder_wait(held)
            # None: time to read the claim again, but not in a tight loop.
            retry = wait_until if wait_until is not None else self.clock.now_ms() + 10.0
            self._awaiting_holder.add(job.spec.name)
        self._push(job, retry)

    def _finish(
        self, job: Job, outcome: str, due: int, rank: int, attempt: int, count: bool = True
    ) -> None:
        lateness = None
        if outcome == "started":
            lateness = self.clock.now_ms() - due
        elif outcome == "missed":
            self.missed_recently.add(self.clock.now_ms())
        if count:
            self._observer.outcome(
                job.spec.name,
                outcome,
                due_ms=due,
                rank=rank,
                attempt=attempt,
                lateness_ms=lateness,
            )
        if outcome in ("missed", "fenced"):
            log.warning("tick %s: %s", TickId(job.spec.name, due).key, outcome)
        job.acted = False
        job.claim_seen = None
        self._awaiting_turn.discard(job.spec.name)
        self._awaiting_holder.discard(job.spec.name)
        if outcome == "started" and job.spec.max_runs is not None:
            self._mirror_count(job, published=True)
        try:
            job.due = job.plan.next_after(due)
        except HrwcronError as exc:  # the schedule ran out of supported years
            job.due = None
            self.mark_bad(job, f"no next tick: {exc}")
            return
        self._collapse(job)
        if job.due is None:
            self._ran_out(job)
            return
        self._push(job, job.due + job.jitter_ms)

    def _collapse(self, job: Job) -> None:
        if job.spec.catchup != "latest" or job.due is None:
            return
        collapsed = collapse_latest(job.plan, job.due, self.clock.now_ms())
        job.due = collapsed.due
        self.missed_recently.add(self.clock.now_ms(), collapsed.missed)
        if job.owner == self.node:
            for outcome, passed in (("missed", collapsed.missed), ("excluded", collapsed.excluded)):
                for _ in range(passed):
                    self._observer.outcome(
                        job.spec.name, outcome, due_ms=job.due, rank=0, attempt=0, lateness_ms=None
                    )

    # ------------------------------------------------------------- jobs that run out of ticks

    def _ran_out(self, job: Job) -> None:
        """The job has no tick left: its window ended, its one-time instant passed or its runs
        are used up. It stays (status shows it done or ended) unless ``delete_after`` is set."""
        job.due = None
        job.acted = False
        job.claim_seen = None
        self._awaiting_turn.discard(job.spec.name)
        self._awaiting_holder.discard(job.spec.name)
        if job.spec.delete_after is None or job.delete_at is not None:
            return
        last = self.last.get(job.subject)
        since: float
        if job.plan.final_ms is not None:
            since = job.plan.final_ms
        elif last is not None and last.watermark:  # ended by its run limit: from the last run
            since = last.watermark
        else:
            since = self.clock.now_ms()
        job.delete_at = since + job.spec.delete_after * 1000
        self._push(job, job.delete_at)

    def _delete_when_due(self, job: Job, now: float, ready: bool) -> None:
        """One replica deletes a finished job once ``delete_after`` has passed: the owner at
        once, the next candidates a failover step apart, each compare-and-set on the revision
        it knows, so a second delete (or an edit made meanwhile) simply wins."""
        if job.delete_at is None:
            return
        if not ready:
            self._push(job, now + 1000)
            return
        self._place(job)
        if job.my_rank < 0:
            return
        wake = next_wake(now, int(job.delete_at), job.my_rank, self._step_ms)
        if wake is not None:
            self._push(job, wake)
            return
        job.entry += 1  # one delete at a time; a failed one pushes the job again
        self._spawn(self._delete_finished(job), f"delete-{job.spec.name}")

    async def _delete_finished(self, job: Job) -> None:
        name = job.spec.name
        try:
            await self._jobs_store.delete(name, job.revision)
        except (ConflictError, NotFoundError):
            log.info("job %s changed or was deleted before its delete_after cleanup", name)
        except Exception as exc:
            log.warning("job %s: deleting it after delete_after failed: %s; retrying", name, exc)
            if self.jobs.get(name) is job:
                self._push(job, self.clock.now_ms() + 1000)
        else:
            log.info(
                "job %s deleted: no tick left and delete_after (%g s) passed",
                name,
                job.spec.delete_after,
            )

    # ----------------------------------------------------------------------- run limits

    def runs_done(self, name: str) -> int | None:
        """Scheduled triggers fired by a max_runs job so far; None when unknown yet."""
        job = self.jobs.get(name)
        if job is None:
            return None
        last = self.last.get(job.subject)
        return self._counter.done(name, last.run if last else 0)

    def _out_of_runs(self, job: Job, now: float) -> bool:
        """True when the job must not act on its tick: its count is unknown yet (fail closed;
        look again shortly) or its runs are used up (then it has no tick left)."""
        done = self.runs_done(job.spec.name)
        if done is None:
            self._read_count(job)
            self._push(job, now + 250)
            return True
        if done >= (job.spec.max_runs or 0):
            self._ran_out(job)
            return True
        return False

    def _read_count(self, job: Job) -> None:
        def loaded() -> None:
            if self.jobs.get(job.spec.name) is job:
                self._mirror_count(job)
                if job.due is not None and not job.busy:
                    self._push(job, 0)

        self._counter.read(job.spec.name, loaded)

    def _mirror_count(self, job: Job, *, published: bool = False) -> None:
        """Raise the durable copy to the run number of the newest trigger on the job's
        subject: done by the replica that published it and by the job's owner, so the count
        survives the stream forgetting the trigger."""
        last = self.last.get(job.subject)
        if last is None or not self._counter.behind(job.spec.name, last.run):
            return
        self._place(job)
        if published or job.first == self.node:
            self._counter.mirror(job.spec.name, last.run, lambda: self._mirror_count(job))

    async def reset_runs(self, name: str, subject: str) -> None:
        """Start a deleted job's run count again, so a job created anew under the same name
        gets all of its runs."""
        last = await self._triggers.last(subject)
        await self._counter.reset(name, last.run if last else 0)

    # ------------------------------------------------------------------ claim and publish

    def claim_ttl(self, job: Job) -> float:
        return job.spec.max_lateness + job.jitter_ms / 1000 + 10 * self.settings.claim_lease + 10

    async def publish_unscheduled(
        self, name: str, msg_id: str, due_ms: int, kind: str, claim_key: str
    ) -> str:
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
        if flight.revision and outcome not in ("started", "duplicate"):
            # Even after a timeout: if the trigger did land, its Msg-Id and the stream check
            # before a retry keep that retry from publishing it again.
            with contextlib.suppress(Exception):
                await self._dispatcher.claims.release(claim_key, flight.revision)
        self._observer.outcome(name, outcome, due_ms=due_ms, rank=0, attempt=1, lateness_ms=None)
        if outcome == "error":
            raise StoreUnavailable(f"trigger {msg_id}: {flight.error}")
        return outcome

    # ------------------------------------------------------------------- failing jobs

    def mark_bad(self, job: Job, problem: str) -> None:
        """A job whose ticks fail for what it is: shown in status, logged once."""
        if problem != job.problem:
            log.warning("job %r: %s", job.spec.name, problem)
        job.problem = problem

    def log_error(self, job: Job, tick_key: str, error: str) -> None:
        """A failed tick is retried every 250 ms; its error is logged once per job and
        message, not once per retry."""
        if error != job.logged:
            log.warning("tick %s: %s", tick_key, error)
            job.logged = error
        else:
            log.debug("tick %s: %s", tick_key, error)

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
        """Join the membership and start every loop; returns once the replica is running."""
        gc.freeze()  # what the process set up so far stays too: no full collection walks it
        membership = self._membership
        await membership.join()
        # Membership first: loading a large job set can outlast the member TTL.
        self._spawn(membership.watch(), "members-watch")
        self._spawn(membership.refresh_loop(), "members-refresh")
        self._spawn(membership.heartbeat_loop(), "heartbeat")
        self._spawn(self._ledger.follow(), "trigger-feed")
        await _wait_event(self._ledger.loaded, 30, "trigger history")
        self._table.start_watch()
        await _wait_event(self._table.loaded, 60, "job list")
        self._spawn(self._table.guard(), "jobs-watch-guard")
        self._spawn(self._timer.run(), "timer")
        self._spawn(self._owned_loop(), "owned-count")
        membership.refresh()

    async def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, let in-flight publishes finish, then leave the membership; all of
        it within ``timeout`` (``shutdown_timeout``), whatever state the connection is in."""
        timeout = self.settings.shutdown_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def left(most: float) -> float:
            return max(0.05, min(most, deadline - loop.time()))

        self._stopping = self._table.stopping = self._ledger.stopping = True
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

    async def _owned_loop(self) -> None:
        """Counts owned jobs after membership or job changes, in slices, so even 100,000 jobs
        neither stall the loop nor cost CPU while nothing changes."""
        while True:
            await self._owned_dirty.wait()
            self._owned_dirty.clear()
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
            self._observer.owned(owners[self.node])
            await asyncio.sleep(1.0)  # coalesce bursts of changes into one recount

    # --------------------------------------------------------------------------- status

    @property
    def jobs_revision(self) -> int:
        """The newest jobs-bucket revision this replica's watch has applied."""
        return self._table.revision

    def job_on_subject(self, subject: str) -> str | None:
        """The loaded job that publishes on ``subject``, if any."""
        return self._table.by_subject.get(subject)

    def ranking_of(self, name: str) -> list[str]:
        job = self.jobs.get(name)
        return self._membership.ranking_of(name, job.spec.tags if job else [])

    def progress(self, name: str) -> Progress:
        """Where a job stands: its state, the next tick that fires (excluded ones passed
        over), and for max_runs its runs so far and left (None while the count is unread)."""
        job = self.jobs[name]
        done = self.runs_done(name) if job.spec.max_runs is not None else None
        left = None if done is None else max(0, (job.spec.max_runs or 0) - done)
        due = None if job.spec.paused or left == 0 else job.due
        if due is not None and job.plan.excluded(due):
            due = job.plan.search(due, budget=STATUS_SEARCH_BUDGET).due
        state = lifecycle(
            job.plan,
            paused=job.spec.paused,
            due=None if left == 0 else job.due,
            now_ms=self.clock.now_ms(),
            runs_left=left,
        )
        return Progress(state, due, done, left)

    def iter_jobs(self) -> Iterator[tuple[str, JobSpec, int | None, int]]:
        """(name, spec, next due ms, jitter ms) for every known job."""
        for name, job in self.jobs.items():
            yield name, job.spec, job.due, job.jitter_ms


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


async def _wait_event(event: asyncio.Event, timeout: float, what: str) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        raise HrwcronError(f"timed out after {timeout:g} s loading the {what}") from None
