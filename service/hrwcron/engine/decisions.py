"""Tick decisions: what a due tick needs now, and what each outcome means for the job.

Fire it, wait for a later failover turn or for a claim holder, count it missed or excluded,
resolve it because the stream already holds it, end a job that ran out of ticks or runs, and
delete a finished job once ``delete_after`` passed. It is one state machine per job, driven by
the timer, the trigger ledger, the job table, membership and the dispatcher's outcomes.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from hrwcron.core.errors import ConflictError, HrwcronError, NotFoundError
from hrwcron.core.outcomes import RESOLVED, Outcome
from hrwcron.core.ticks import TickId
from hrwcron.core.turns import collapse_latest, due_after, next_wake
from hrwcron.engine.clock import Clock
from hrwcron.engine.flight import Flight
from hrwcron.engine.jobs import HeldClaim, Job, JobTable
from hrwcron.engine.ledger import TriggerLedger
from hrwcron.engine.marks import Mark, MarksHeard
from hrwcron.engine.membership import Membership
from hrwcron.engine.ports import JobsPort, LastTrigger, Observer
from hrwcron.engine.recent import RecentCounts
from hrwcron.engine.run_counter import RunCounter
from hrwcron.engine.settings import Settings
from hrwcron.engine.timer import Timer

log = logging.getLogger("hrwcron.scheduler")

# The rank of a tick resolved without this replica acting on it.
NOT_RANKED = -1


# Parked jobs released at a time before the loop gets a turn (a membership change releases
# every one of them).
RELEASE_SLICE = 256

# Jobs whose newest trigger is read in one go before they are planned (holding a share), and
# how long that read may take before they are planned without it.
READ_BATCH = 4000
READ_TIMEOUT_S = 10.0


class TickDecisions:
    """The tick state machine of every job; the dispatcher's host and the table's hooks."""

    def __init__(
        self,
        settings: Settings,
        *,
        clock: Clock,
        observer: Observer,
        counter: RunCounter,
        jobs_store: JobsPort,
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
    ) -> None:
        """Call :meth:`attach` with the parts before the first tick."""
        self.settings = settings
        self.node = settings.node_id
        self.clock = clock
        self._observer = observer
        self._counter = counter
        self._jobs_store = jobs_store
        self._spawn = spawn
        self.stopping = False
        self.owned_dirty = asyncio.Event()  # the jobs or their candidates changed
        self._awaiting_turn: set[str] = set()  # due ticks waiting for a later failover turn
        self._awaiting_holder: set[str] = set()  # due ticks whose claim another replica holds
        self._step_ms = int(settings.failover_step * 1000)
        # Owner side of the progress marks: the fire instant of every due tick this replica
        # owns (or could not decide, not being ready) that is not resolved yet, and how many
        # ticks it has resolved so far.
        self.owed: dict[str, int] = {}
        self.resolved = 0
        # Follower side: the jobs left to a live owner that keeps up, per owner (job name ->
        # the job and its entry generation when parked). They cost nothing per tick; when the
        # owner falls silent they catch up from its last mark (release_parked).
        self.marks: MarksHeard | None = None
        self.parked: dict[str, dict[str, tuple[Job, int]]] = {}
        # Ticks that passed their lateness window unpublished (whoever owned them).
        self.missed_recently = RecentCounts()
        self.jobs: dict[str, Job] = {}
        self.last: dict[str, LastTrigger] = {}
        # Holding a share with progress marks, a replica reads the newest trigger of the jobs
        # it loads instead of every subject's: a job whose subject it has not read waits here,
        # off the timer, for one batched read (see read_before_planning).
        self._read_last: Callable[[list[str], float], Awaitable[None]] | None = None
        self._unread: dict[str, Job] = {}
        # The fire instants of the unread jobs' first ticks (fire, sequence, name, job), stale
        # entries dropped from the top: this replica's mark stays below the earliest.
        self._unread_fires: list[tuple[int, int, str, Job]] = []
        self._unread_seq = itertools.count()
        self._reader: asyncio.Task[None] | None = None
        self.planned = asyncio.Event()  # no loaded job is waiting for its subject's read
        self.planned.set()
        # Quiet, a replica does not see the others' triggers go by: a tick past its lateness
        # window may have been published by another replica while this one was paused or cut
        # off. Such ticks wait here (job, entry, due) for one batched read of their subjects
        # before any is counted missed.
        self._unsure: dict[str, tuple[Job, int, int]] = {}
        self._checker: asyncio.Task[None] | None = None
        # Jobs whose tick looked past its window by a clock this replica did not trust.
        self._doubtful: dict[str, Job] = {}

    def attach(
        self, table: JobTable, ledger: TriggerLedger, membership: Membership, timer: Timer[Flight]
    ) -> None:
        self._table = table
        self._timer = timer
        self.jobs = table.jobs
        self.last = ledger.last
        # The parts' hot methods, bound once: a tick pays no more lookups than before.
        self._push = timer.push
        self._place = membership.place
        self._ledger_done = ledger.done
        self._ledger_read = ledger.read
        self._ready: Callable[[], bool] = lambda: membership.ready
        self._clock_off: Callable[[], bool] = lambda: membership.clock_off
        self._holder_wait: Callable[[HeldClaim], float | None] = membership.holder_wait
        self.holder_live: Callable[[str, str], bool] = membership.holder_live

    @property
    def quiet(self) -> bool:
        return self.marks is not None

    @property
    def clock_off(self) -> bool:
        return self._clock_off()

    def read_before_planning(self, read: Callable[[list[str], float], Awaitable[None]]) -> None:
        """Plan a job whose subject the ledger does not know only after ``read(subjects,
        timeout)`` brought its newest trigger in: the replica then holds the newest triggers
        of its own share, not of every job."""
        self._read_last = read

    def use_marks(self, marks: MarksHeard) -> None:
        """Followers consult the owners' progress marks (without them, they act at their turn
        as if every owner might be gone)."""
        self.marks = marks

    def membership_changed(self, readiness: bool, candidates: bool) -> None:
        if readiness:
            self._timer.wakeup.set()
            doubtful, self._doubtful = self._doubtful, {}
            for name, job in doubtful.items():
                if self.jobs.get(name) is job and not job.busy:
                    self._push(job, 0)  # decided again, by the clock as it is now
        if not candidates:
            return
        self.owned_dirty.set()
        # A member left or stopped being ready: ticks waiting for a later failover turn
        # may now be ours to fire, so look at them again instead of at their old turn.
        # So may ticks whose claim holder just left or stopped being ready.
        for name in self._awaiting_turn | self._awaiting_holder:
            waiting = self.jobs.get(name)
            if waiting is not None and not waiting.busy and name not in self._unread:
                self._push(waiting, 0)
        self._awaiting_turn.clear()
        self._awaiting_holder.clear()
        self.release_parked(everyone=True)

    # ----------------------------------------------- what a change elsewhere means for ticks

    def prepare(self, job: Job) -> None:
        self.owed.pop(job.spec.name, None)
        if not self._unread_subject(job):
            self._collapse(job)  # otherwise once its subject is read

    def loaded(self, job: Job, *, created: bool = False) -> None:
        self.owned_dirty.set()
        if self._unread_subject(job):
            if created:
                # Nothing to read: its ticks come after it was written, and a trigger an earlier
                # job of the same name left there makes the first publish fenced, then read.
                # prepare() left its collapse to the read, so it is done here.
                self._collapse(job)
            else:
                self._unread[job.spec.name] = job
                assert job.due is not None
                entry = (job.due + job.jitter_ms, next(self._unread_seq), job.spec.name, job)
                heapq.heappush(self._unread_fires, entry)
                if self._reader is None:
                    self.planned.clear()
                    self._reader = self._spawn(self._read_unread(), "newest-triggers")
                return
        self._unread.pop(job.spec.name, None)  # an earlier version of it, if one waits
        self._plan(job)

    def _unread_subject(self, job: Job) -> bool:
        return self._read_last is not None and job.due is not None and job.subject not in self.last

    def _plan(self, job: Job) -> None:
        if job.due is not None:
            if job.spec.max_runs is not None:
                self._read_count(job)
            self._push(job, job.due + job.jitter_ms)
        elif not job.spec.paused:
            self._ran_out(job)

    def runs_unknown(self, name: str) -> None:
        self._counter.forget(name)

    def removed(self, job: Job) -> None:
        self.owed.pop(job.spec.name, None)
        self._doubtful.pop(job.spec.name, None)
        if self._unread.get(job.spec.name) is job:
            del self._unread[job.spec.name]
        if self._read_last is not None:
            self.last.pop(job.subject, None)  # the ledger holds the share's subjects only
        self.owned_dirty.set()

    async def _read_unread(self) -> None:
        """Read the newest triggers of the jobs waiting for them, a batch at a time, and plan
        each job from what its subject holds. A read that fails or takes too long leaves the
        jobs waiting then to the fence: planned without it, a tick the stream already holds is
        found there when its publish is refused. Jobs loaded later are read again."""
        read = self._read_last
        assert read is not None
        try:
            while self._unread and not self.stopping:
                # Left in _unread until planned, so the mark stays below them meanwhile.
                batch = list(itertools.islice(self._unread.values(), READ_BATCH))
                try:
                    await read([job.subject for job in batch], READ_TIMEOUT_S)
                except Exception as exc:
                    batch = list(self._unread.values())
                    log.warning(
                        "reading the newest triggers of %d jobs failed (%s); their ticks are "
                        "checked against the stream when they are published instead",
                        len(batch),
                        repr(exc) if isinstance(exc, TimeoutError) else exc,
                    )
                now = self.clock.now_ms()
                for count, job in enumerate(batch, 1):
                    name = job.spec.name
                    if self._unread.get(name) is job and self.jobs.get(name) is job:
                        del self._unread[name]
                        self._plan_read(job, now)
                    elif self._table.by_subject.get(job.subject) is None:
                        self.last.pop(job.subject, None)  # removed while it was read
                    if count % RELEASE_SLICE == 0:
                        await asyncio.sleep(0)
        finally:
            self._reader = None
            if not self._unread:
                self._unread_fires.clear()
            if not self._unread or self.stopping:
                self.planned.set()

    def _plan_read(self, job: Job, now: float) -> None:
        """Plan a job whose subject was read (or could not be): past the ticks the stream
        holds already, then as any loaded job."""
        seen = self.last.get(job.subject)
        try:
            if seen is not None and job.due is not None and seen.watermark >= job.due:
                job.due = due_after(job.plan, seen.watermark, now)
            self._collapse(job)
            self._plan(job)
        except Exception as exc:
            # One job that cannot be planned, not a reader that stops: it stays loaded with
            # no tick, and status shows why.
            log.exception("job %r: planning it after reading its subject failed", job.spec.name)
            job.due = None
            self.mark_bad(job, f"cannot be scheduled: {exc}")

    def newer_trigger(self, subject: str, seen: LastTrigger) -> None:
        name = self._table.by_subject.get(subject)
        job = self.jobs.get(name) if name else None
        if job is None or name in self._unread:
            return  # not planned yet: its plan starts from what the ledger holds then
        if job.spec.max_runs is not None:
            self._mirror_count(job)
        if job.busy or self.stopping:
            return
        due = job.due
        if due is not None and seen.watermark >= due:
            # The tick it waits for is in the stream: resolved here and now, without a
            # trip through the timer (every replica sees every trigger go by).
            self._published_elsewhere(job, due)

    # --------------------------------------------------------------------- a due tick

    def evaluate(self, job: Job, now: float, ready: bool, acts: list[Flight]) -> None:
        due = job.due
        if self.stopping:
            return
        if due is None:
            self._delete_when_due(job, now, ready)
            return
        if self._ledger_done(job.subject, due):
            self._published_elsewhere(job, due)
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
            self._excluded(job, due, ready)
            return
        if not ready and self._clock_off():
            self._doubt(job)
            return
        if now > due + job.spec.max_lateness_ms:
            if self.marks is not None:
                self._check_missed(job, due, ready)
                return
            self._missed(job, due, now, ready)
            return
        rank = job.my_rank
        fire = due + job.jitter_ms
        if (rank == 0 or not ready) and now >= fire:
            self.owed[job.spec.name] = fire  # holds this replica's mark back until resolved
        elif self.owed:
            self.owed.pop(job.spec.name, None)
        if not ready or rank < 0:
            # Fail closed: look again when the tick might be done, or our readiness returns.
            self._push(job, min(now + 250, due + job.spec.max_lateness_ms + 1))
            return
        wake = next_wake(now, fire, rank, self._step_ms)
        if wake is not None:
            if now >= fire:
                self._awaiting_turn.add(job.spec.name)
            self._push(job, wake)
            return
        self._awaiting_turn.discard(job.spec.name)
        marks = self.marks
        if rank > 0 and marks is not None and marks.verdict(job.first, fire, job.revision):
            self._park(job)  # done or on its way: the owner is live and keeps up
            return
        held = job.claim_seen
        if held is not None and self.marks is None:
            # Another instance holds this tick's claim: wait for the trigger in the feed or for
            # the holder to fall silent, without reading the claim again meanwhile. (Quiet, with
            # no feed, the dispatcher reads the claim and the subject instead; see acted.)
            wait_until = self._holder_wait(held)
            if wait_until is not None:
                self._awaiting_holder.add(job.spec.name)
                self._push(job, min(wait_until, due + job.spec.max_lateness_ms + 1))
                return
        self._awaiting_holder.discard(job.spec.name)
        job.busy = True
        acts.append(Flight(job, job.entry, due, rank))

    def _counts(self, job: Job, ready: bool) -> bool:
        """Whether this replica counts the job's missed or excluded tick: its owner does (or,
        with no owner, any ready replica), so the tick is counted once."""
        return job.first == self.node or (job.first is None and ready)

    def _published_elsewhere(self, job: Job, due: int) -> None:
        """The stream holds the tick at ``due``: resolved without this replica publishing it."""
        self._finish(job, Outcome.ALREADY_CLAIMED if job.acted else Outcome.NOT_OWNER, due)

    def _doubt(self, job: Job) -> None:
        """The job's tick came due while this replica does not trust its clock (the server's
        time, as the members leader tells it, is off from its own by more than
        max_clock_skew): it is decided once readiness changes. Off the timer until then: by
        that clock the tick may look past its window when it is not, and a wake-up time on it
        could lie 30 s after the clock is set right, when the window has closed."""
        job.entry += 1  # no heap entry stands for it meanwhile
        self._doubtful[job.spec.name] = job

    def _excluded(self, job: Job, due: int, ready: bool) -> None:
        """Never fired, late or otherwise; counted once, by the owner, like a missed tick."""
        counts = self._counts(job, ready)
        self._finish(job, Outcome.EXCLUDED if counts else Outcome.NOT_OWNER, due, count=counts)

    def _missed(self, job: Job, due: int, now: float, ready: bool) -> None:
        """The tick passed its lateness window unpublished: counted once, by its owner."""
        counts = self._counts(job, ready)
        if not counts:
            self.missed_recently.add(now)  # the owner's own count is taken in _finish
        self._finish(job, Outcome.MISSED if counts else Outcome.NOT_OWNER, due, count=counts)

    def _check_missed(self, job: Job, due: int, ready: bool) -> None:
        job.busy = True  # off the timer until its subject is read
        if job.my_rank == 0 or not ready:
            self.owed[job.spec.name] = due + job.jitter_ms  # the mark stays below it meanwhile
        self._unsure[job.spec.name] = (job, job.entry, due)
        if self._checker is None:
            self._checker = self._spawn(self._read_unsure(), "missed-check")

    async def _read_unsure(self) -> None:
        """Read the subjects of the ticks that look missed, a batch at a time: one the stream
        shows done is another replica's, the rest are missed. A read that fails leaves them
        missed, as a replica that cannot reach NATS can tell no better."""
        skew_ms = self.settings.max_clock_skew_ms
        try:
            while self._unsure and not self.stopping:
                names = list(itertools.islice(self._unsure, READ_BATCH))
                batch = [self._unsure.pop(name) for name in names]
                asked = self.clock.now_ms()
                try:
                    await self._ledger_read([job.subject for job, _, _ in batch], READ_TIMEOUT_S)
                except Exception as exc:
                    log.debug(
                        "reading %d subjects before counting ticks missed: %s", len(batch), exc
                    )
                ready = self._ready()
                for count, (job, entry, _) in enumerate(batch, 1):
                    job.busy = False
                    if self.jobs.get(job.spec.name) is not job or job.entry != entry:
                        continue  # changed or removed meanwhile
                    try:
                        self._settle_late(job, asked, skew_ms, ready)
                    except Exception as exc:  # one job, not the check of the others
                        log.exception("job %r: settling its late ticks failed", job.spec.name)
                        self.mark_bad(job, f"cannot be scheduled: {exc}")
                    if count % RELEASE_SLICE == 0:
                        await asyncio.sleep(0)
        finally:
            self._checker = None

    def _settle_late(self, job: Job, asked: float, skew_ms: float, ready: bool) -> None:
        """Resolve the job's ticks that nobody could publish any more when its subject was
        read (at ``asked``): their lateness window had closed by then, on every replica's clock
        (``skew_ms`` apart at most). At most RELEASE_SLICE of them; the timer brings the rest."""
        now = self.clock.now_ms()
        if not ready and self._clock_off():
            self._doubt(job)  # as in evaluate
            return
        for _ in range(RELEASE_SLICE):
            due = job.due
            if due is None:
                return
            if self._ledger_done(job.subject, due):
                self._published_elsewhere(job, due)
                continue
            window_end = due + job.spec.max_lateness_ms
            if window_end + skew_ms >= asked:
                if window_end < now:  # late, but another replica might still have published
                    self._push(job, window_end + skew_ms + 1)
                return  # otherwise _finish has pushed it: the timer decides it in its turn
            self._place(job)  # the ranking may have changed while the subject was read
            if job.plan.exclusions and job.plan.excluded(due):
                self._excluded(job, due, ready)
                continue
            self._missed(job, due, now, ready)

    def acted(self, flight: Flight) -> None:
        """A tick's act ended with ``flight.outcome``: resolve it, or look again later."""
        job = flight.job
        job.busy = False
        if job.entry != flight.entry or self.jobs.get(job.spec.name) is not job:
            return  # the job changed or was removed meanwhile
        outcome, due, rank, attempt = flight.outcome, flight.due, flight.rank, flight.attempt
        assert outcome is not None  # acted is told of resolved flights only
        if outcome in RESOLVED:
            self._finish(job, outcome, due, rank=rank, attempt=attempt)
            return
        self._observer.outcome(
            job.spec.name, outcome, due_ms=due, rank=rank, attempt=attempt, lateness_ms=None
        )
        if flight.earlier:
            self._rewind(job, flight.earlier)
            return
        retry = self.clock.now_ms() + 250.0
        held = job.claim_seen
        if outcome == Outcome.LOCK_BUSY and held is not None:
            wait_until = self._holder_wait(held)
            # None: time to read the claim again, but not in a tight loop.
            retry = wait_until if wait_until is not None else self.clock.now_ms() + 10.0
            if self.marks is not None:
                # No feed tells this replica when the holder publishes: look every half step.
                retry = min(retry, self.clock.now_ms() + self._step_ms / 2)
            self._awaiting_holder.add(job.spec.name)
        self._push(job, retry)

    def _rewind(self, job: Job, earlier: tuple[int, ...]) -> None:
        """Other replicas claimed the job's ticks at ``earlier``, before the one this replica
        was about to publish, and the stream does not hold them: had this replica published
        first, the fence would refuse those triggers and the ticks would be lost. The job goes
        back to the first still inside its window, decided at once like any claimed tick (left
        to a live holder, taken over from a silent one); the later tick's claim stays held
        meanwhile. Past their windows here, they are not decided again (that would find them
        missed and come back to the later tick at once, in a loop): the later tick waits until
        a replica ``max_clock_skew`` behind this one could not publish them either."""
        name = job.spec.name
        lateness = job.spec.max_lateness_ms
        now = self.clock.now_ms()
        due = next((due for due in earlier if due + lateness >= now), None)
        if due is None:
            self._push(job, earlier[-1] + lateness + self.settings.max_clock_skew_ms + 1)
            return
        job.due = due
        job.acted = False
        job.claim_seen = None
        self._awaiting_turn.discard(name)
        self._awaiting_holder.discard(name)
        owed = self.owed.get(name)
        if owed is not None:
            self.owed[name] = min(owed, due + job.jitter_ms)  # the mark must not pass it
        self._push(job, self.clock.now_ms())

    def _finish(
        self,
        job: Job,
        outcome: Outcome,
        due: int,
        *,
        rank: int = NOT_RANKED,
        attempt: int = 0,
        count: bool = True,
    ) -> None:
        """Resolve the tick at ``due`` and move the job on. ``rank`` and ``attempt`` are
        those of this replica's act on it (NOT_RANKED and 0: resolved without one)."""
        lateness = None
        if outcome == Outcome.STARTED:
            lateness = self.clock.now_ms() - due
        elif outcome == Outcome.MISSED:
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
        if outcome in (Outcome.MISSED, Outcome.FENCED):
            log.warning("tick %s: %s", TickId(job.spec.name, due).key, outcome)
        if self.owed and self.owed.pop(job.spec.name, None) is not None:
            self.resolved += 1
        job.acted = False
        job.claim_seen = None
        self._awaiting_turn.discard(job.spec.name)
        self._awaiting_holder.discard(job.spec.name)
        if outcome == Outcome.STARTED and job.spec.max_runs is not None:
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
        collapsed = collapse_latest(
            job.plan, job.due, self.clock.earliest_ms(self.settings.max_clock_skew_ms)
        )
        job.due = collapsed.due
        self.missed_recently.add(self.clock.now_ms(), collapsed.missed)
        if job.owner == self.node:
            for outcome, passed in (
                (Outcome.MISSED, collapsed.missed),
                (Outcome.EXCLUDED, collapsed.excluded),
            ):
                for _ in range(passed):
                    self._observer.outcome(
                        job.spec.name, outcome, due_ms=job.due, rank=0, attempt=0, lateness_ms=None
                    )

    # ------------------------------------------------------------------ progress marks

    def resolved_ms(self, now: float) -> int:
        """This replica's mark: every tick it owns with a fire instant at or before this is
        resolved. Held back by the owed ticks and by anything the timer has yet to look at."""
        mark = now
        heap = self._timer.heap
        if heap:
            mark = min(mark, heap[0][0] - 1)
        if self.owed:
            mark = min(mark, min(self.owed.values()) - 1)
        fires = self._unread_fires
        while fires and self._unread.get(fires[0][2]) is not fires[0][3]:
            heapq.heappop(fires)  # planned, replaced or removed since
        if fires:
            mark = min(mark, fires[0][0] - 1)
        return int(mark)

    def _park(self, job: Job) -> None:
        """Leave the job to its live owner: no heap entry, no work, until the owner falls
        silent, stops advancing, leaves, or the membership changes."""
        owner = job.first
        assert owner is not None
        job.entry += 1  # no heap entry stands for the job while it is parked
        self.parked.setdefault(owner, {})[job.spec.name] = (job, job.entry)

    def parked_on(self, job: Job) -> Mark | None:
        """The newest mark of the owner ``job`` is parked on, if it is parked."""
        owner = job.first
        if owner is None or self.parked.get(owner, {}).get(job.spec.name) != (job, job.entry):
            return None
        return self.marks.mark_of(owner) if self.marks is not None else None

    def heard(self, mark: Mark) -> None:
        """Another replica's mark. A new instance of a node: what was parked on the old one
        catches up from the old one's last mark and is decided again."""
        marks = self.marks
        assert marks is not None
        before = marks.mark_of(mark.node)
        if before is not None and before.instance != mark.instance:
            self._release(mark.node, before)
        marks.hear(mark)

    def release_parked(self, *, everyone: bool = False) -> None:
        """Jobs parked on owners that fell silent, left or stopped advancing (or on every
        owner, when the membership changed) catch up and are decided again now."""
        marks = self.marks
        if marks is None or not self.parked:
            return
        for owner in list(self.parked):
            if everyone or marks.silent(owner):
                self._release(owner, marks.mark_of(owner))

    def _release(self, owner: str, mark: Mark | None) -> None:
        released = list(self.parked.pop(owner, {}).values())
        if len(released) <= RELEASE_SLICE:
            self._release_now(released, mark)
        else:  # tens of thousands of jobs must not hold the loop: in slices
            self._spawn(self._release_sliced(released, mark), f"release-{owner}")

    async def _release_sliced(self, released: list[tuple[Job, int]], mark: Mark | None) -> None:
        for start in range(0, len(released), RELEASE_SLICE):
            self._release_now(released[start : start + RELEASE_SLICE], mark)
            await asyncio.sleep(0)

    def _release_now(self, released: list[tuple[Job, int]], mark: Mark | None) -> None:
        for job, entry in released:
            if self.jobs.get(job.spec.name) is not job or job.entry != entry or job.busy:
                continue  # changed or removed meanwhile
            if mark is None or self._catch_up(job, mark):
                self._push(job, 0)

    def _catch_up(self, job: Job, mark: Mark) -> bool:
        """Move the job past every tick the owner's ``mark`` says it resolved; False when the
        job has no tick left to push."""
        due = job.due
        if due is None or mark.jobs_revision < job.revision:
            return True
        after = self.next_unresolved(job, mark)
        if after == due:
            return True
        job.acted = False
        job.claim_seen = None
        job.due = after
        if after is None:
            self._ran_out(job)
            return False
        self._collapse(job)
        return True

    def next_unresolved(self, job: Job, mark: Mark) -> int | None:
        """The job's first tick whose fire instant is past ``mark``."""
        due = job.due
        if due is None or due + job.jitter_ms > mark.resolved_ms:
            return due
        try:
            return job.plan.next_after(mark.resolved_ms - job.jitter_ms)
        except HrwcronError as exc:  # the schedule ran out of supported years
            self.mark_bad(job, f"no next tick: {exc}")
            return None

    # ------------------------------------------------------------- jobs that run out of ticks

    def _ran_out(self, job: Job) -> None:
        """The job has no tick left: its window ended, its one-time instant passed or its runs
        are used up. It stays (status shows it done or ended) unless ``delete_after`` is set."""
        self.owed.pop(job.spec.name, None)
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

    def claim_ttl(self, job: Job) -> float:
        return job.spec.max_lateness + job.jitter_ms / 1000 + 10 * self.settings.claim_lease + 10
