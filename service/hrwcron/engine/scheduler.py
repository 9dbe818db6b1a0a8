"""The replica engine: membership, one timer heap for every job, and the life of a tick.

A tick (job J, nominal due T) is resolved once it is in the trigger stream, was skipped, or
passed ``T + max_lateness``. Each replica walks every job's ticks in due order and never looks
at a later tick before the earlier one is resolved; that, plus subject-sequence fencing on the
publish, is what keeps a job's triggers in due order and a zombie from overtaking anything.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import heapq
import itertools
import logging
import sys
import time
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import xxhash

from hrwcron import __version__
from hrwcron.core import hrw
from hrwcron.core.errors import (
    ConflictError,
    DuplicateNodeError,
    HrwcronError,
    NotFoundError,
    Problem,
)
from hrwcron.core.model import Heartbeat, JobSpec, encode
from hrwcron.core.plan import STATUS_SEARCH_BUDGET, TickPlan, lifecycle
from hrwcron.core.planner import Candidate, collapse_latest, first_due, next_wake, ranking
from hrwcron.core.schedule import Schedule, jitter_ms
from hrwcron.core.ticks import TickId
from hrwcron.engine.clock import Clock
from hrwcron.engine.counting import RunCounter
from hrwcron.engine.dispatch import Dispatcher, Flight, HeldClaim
from hrwcron.engine.failpoints import Failpoints
from hrwcron.engine.ports import (
    ClaimsPort,
    CountsPort,
    JobEvent,
    JobsPort,
    LastTrigger,
    MembersPort,
    Observer,
    RunsPort,
    ServerTime,
    StoreUnavailable,
    TriggersPort,
)
from hrwcron.engine.recent import RecentCounts
from hrwcron.engine.view import MembershipView

log = logging.getLogger("hrwcron.scheduler")

# A feed whose messages are already buffered never suspends on its own, so loading 100,000
# jobs or trigger subjects would hold the event loop for seconds: yield once a slice of work
# took this long (checked every few items).
SLICE_S = 0.005
CHECK_EVERY = 16
# Jobs and trigger history loaded at start-up live as long as the replica. Every so many of
# them they are moved out of the cyclic garbage collector's sight (gc.freeze): otherwise each
# full collection walks all of them, tens of milliseconds of stalled loop at 100,000 jobs.
FREEZE_EVERY = 5_000
# Due ticks the timer evaluates before it hands them over and lets the loop run.
TIMER_BATCH = 256

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


@dataclass(frozen=True)
class Settings:
    node_id: str
    weight: float = 1.0
    tags: tuple[str, ...] = ()
    heartbeat_interval: float = 1.0
    member_ttl: float = 3.0
    membership_refresh: float = 1.0
    failover_step: float = 1.0
    claim_lease: float = 2.0
    max_clock_skew: float = 1.0
    subject_prefix: str = "hrwcron.trigger"
    max_payload: int = 64 * 1024
    max_in_flight: int = 512
    shutdown_timeout: float = 5.0
    http_address: str = ""
    jobs_watch_check: float = 10.0
    # How long a batch of claims or triggers waits for its answers before they count as errors.
    write_timeout: float = 5.0


@dataclass(slots=True, eq=False)
class _Job:
    spec: JobSpec
    schedule: Schedule
    plan: TickPlan
    subject: str
    jitter_ms: int
    revision: int
    digest: int
    due: int | None = None
    entry: int = 0  # generation of this job's single live heap entry
    busy: bool = False
    acted: bool = False
    claim_seen: HeldClaim | None = None  # this tick's claim, seen held by another instance
    owner: str | None = None  # the owner at the last decision, to report changes
    # Under ``order_generation``: the owner, and this replica's rank (-1: not eligible).
    first: str | None = None
    my_rank: int = -1
    order_generation: int = -1
    problem: str = ""  # why the server refused this job's last trigger; shown in status
    logged: str = ""  # the last tick error logged, so a retried failure is logged once
    # Set once the job has no tick left and delete_after is set: when it is to be deleted.
    delete_at: float | None = None


@dataclass(frozen=True, slots=True)
class Progress:
    state: str  # see plan.lifecycle
    next_due: int | None  # the next tick that fires
    runs_done: int | None
    runs_left: int | None


# A heap entry: (wake at ms, push sequence, job name, the job's entry generation). A plain
# tuple compares in C, which matters when a top-of-the-minute herd is popped at once.
_Wake = tuple[float, int, str, int]


class Scheduler:
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
        self._members = members
        self._claims = claims
        self._triggers = triggers
        self._jobs_store = jobs
        self._runs = runs
        self._counter = RunCounter(counts, self._spawn)
        self._observer = observer
        self._failpoints = failpoints or Failpoints({})
        self.view = MembershipView(self.node, settings.member_ttl, self.clock.monotonic)
        self.jobs: dict[str, _Job] = {}
        self._by_subject: dict[str, str] = {}
        self.last: dict[str, LastTrigger] = {}
        self._heap: list[_Wake] = []
        self._seq = itertools.count()
        self._wakeup = asyncio.Event()
        # Ticks beyond max_in_flight wait here for a batch to start them.
        self._queued_acts: collections.deque[Flight] = collections.deque()
        self._dispatcher = Dispatcher(self)
        self.tracing = observer.tracing
        # A claim holder unheard for this long has missed a heartbeat: its claim is taken over.
        interval = settings.heartbeat_interval
        self._silence = interval + max(0.25, interval / 4)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._digest = 0
        self._revision = 0
        self._started_ms = 0
        self._beat_ok: float | None = None
        self._view_ok: float | None = None
        self._jobs_loaded = asyncio.Event()
        self._triggers_loaded = asyncio.Event()
        self._stopping = False
        self.fatal: HrwcronError | None = None
        self.failed = asyncio.Event()  # set with ``fatal``: the process should exit
        self._owned_dirty = asyncio.Event()
        self._awaiting_turn: set[str] = set()  # due ticks waiting for a later failover turn
        self._awaiting_holder: set[str] = set()  # due ticks whose claim another replica holds
        self._was_ready: bool | None = None
        self._candidates: list[Candidate] = []
        self._jobs_revision = 0  # newest jobs-bucket revision the watch delivered
        self._jobs_watch: asyncio.Task[Any] | None = None
        self._generation = 0  # bumped whenever the candidates change
        self._plain: list[tuple[bytes, str]] | None = []  # candidates for hrw.rank_prepared
        self._step_ms = int(settings.failover_step * 1000)
        # What operators see besides the running jobs: stored specs this replica did not load
        # (revision, why), jobs per owner as of the last recount, ticks that passed their
        # lateness window unpublished (whoever owned them).
        self.skipped: dict[str, tuple[int, str]] = {}
        self.owned_counts: dict[str, int] = {}
        self.missed_recently = RecentCounts()

    # ----------------------------------------------------------------- readiness and members

    @property
    def not_ready_reason(self) -> str:
        """Empty when this replica may claim; otherwise why it must not (fail closed)."""
        now = self.clock.monotonic()
        ttl = self.settings.member_ttl
        if self.fatal is not None:
            return f"fatal: {self.fatal}"
        if self._stopping:
            return "stopping"
        if self._beat_ok is None or now - self._beat_ok > ttl:
            return "heartbeat is not reaching NATS"
        if self._view_ok is None or now - self._view_ok > ttl:
            return "membership view is stale"
        if not self._jobs_loaded.is_set() or not self._triggers_loaded.is_set():
            return "loading jobs and trigger history"
        if not self.clock.estimator.known:
            return "clock offset to the NATS server is not known yet"
        skew = abs(self.clock.offset_ms)
        if skew > self.settings.max_clock_skew * 1000:
            return (
                f"clock is {skew:.0f} ms off the NATS server's "
                f"(max_clock_skew is {self.settings.max_clock_skew:g} s)"
            )
        return ""

    @property
    def ready(self) -> bool:
        return not self.not_ready_reason

    def _refresh_candidates(self) -> None:
        ready = self.ready
        if ready != self._was_ready:
            self._was_ready = ready
            self._observer.readiness(ready, self.not_ready_reason)
            self._wakeup.set()
        candidates = self.view.candidates(ready, self.settings.weight, list(self.settings.tags))
        if candidates != self._candidates:
            self._candidates = candidates
            self._plain = hrw.prepare([c.node for c in candidates])
            if any(c.weight != 1.0 for c in candidates):
                self._plain = None  # weighted: planner.ranking
            self._generation += 1
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
            self._observer.membership([c.node for c in candidates], 0)
            log.info("live members: %s", ", ".join(c.node for c in candidates) or "none")

    def _heartbeat(self) -> Heartbeat:
        return Heartbeat(
            node=self.node,
            instance=self.instance,
            started_ms=self._started_ms,
            version=__version__,
            weight=self.settings.weight,
            tags=list(self.settings.tags),
            digest=self.digest,
            jobs=len(self.jobs),
            ready=self.ready,
            reason=self.not_ready_reason,
            http=self.settings.http_address,
        )

    @property
    def digest(self) -> str:
        return f"{self._digest:016x}"

    async def _heartbeat_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.settings.heartbeat_interval)
            try:
                await self._beat()
                self._beat_ok = self.clock.monotonic()
            except ConflictError as exc:
                self.fatal = DuplicateNodeError(
                    f"node id {self.node!r} is being written by another replica: {exc}"
                )
                log.error("%s; this replica stops claiming", self.fatal)
                self.failed.set()
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)
            age = self.clock.monotonic() - self._beat_ok if self._beat_ok else float("inf")
            self._observer.heartbeat(age < self.settings.member_ttl, self.clock.offset_ms, age)
            self._check_digests()
            self._refresh_candidates()

    async def _beat(self, first: bool = False) -> None:
        """Write the heartbeat and learn the clock offset from the server's timestamp of it."""
        if first:
            # Registering may wait for a previous holder's key to expire: far too long a round
            # trip for a clock sample, so the sample comes from an ordinary beat right after.
            self._revision = await self._members.register(
                self.node, self._heartbeat(), wait=self.settings.member_ttl + 1
            )
        sent = self.clock.local_ms()
        self._revision = await self._members.beat(self.node, self._heartbeat(), self._revision)
        received = self.clock.local_ms()
        stored = await self._members.stored_at(self._revision)
        if stored is not None:
            self.clock.estimator.add(ServerTime(sent, stored, received))

    async def _refresh_loop(self) -> None:
        while not self._stopping:
            try:
                self.view.replace_all(await self._members.snapshot())
                self._view_ok = self.clock.monotonic()
            except Exception as exc:
                log.warning("membership read failed: %s", exc)
            self._refresh_candidates()
            await asyncio.sleep(self.settings.membership_refresh)

    async def _watch_members(self) -> None:
        while not self._stopping:
            try:
                async for node, record in self._members.watch():
                    self.view.update(node, record)
                    self._refresh_candidates()
            except Exception as exc:
                log.warning("membership watch stopped (%s); restarting it", exc)
            await asyncio.sleep(self.settings.heartbeat_interval)

    def _check_digests(self) -> None:
        others = [
            node
            for node, (hb, age) in self.view.heartbeats().items()
            if node != self.node
            and hb.digest
            and age < self.settings.member_ttl
            and hb.digest != self.digest
        ]
        self._observer.digest_mismatch(others)

    # ----------------------------------------------------------------------------- jobs

    async def _watch_jobs(self) -> None:
        while not self._stopping:
            try:
                applied = 0
                # The initial state read after this covers every revision up to here, even
                # one whose message is gone (a removed delete marker): the guard must not
                # take that gap for a silent watch.
                covered = 0
                with contextlib.suppress(Exception):
                    covered = await self._jobs_store.last_revision()
                began = time.perf_counter()
                async for event in self._jobs_store.watch():
                    if event is None:
                        if not self._jobs_loaded.is_set():
                            log.info("loaded %d jobs", len(self.jobs))
                            gc.freeze()
                        self._jobs_loaded.set()
                        self._jobs_revision = max(self._jobs_revision, covered)
                        continue
                    self._jobs_revision = max(self._jobs_revision, event.revision)
                    self._apply_job(event)
                    applied += 1
                    if applied % FREEZE_EVERY == 0 and not self._jobs_loaded.is_set():
                        gc.freeze()
                    if applied % CHECK_EVERY == 0 and time.perf_counter() - began > SLICE_S:
                        await asyncio.sleep(0)
                        began = time.perf_counter()
            except Exception as exc:
                log.warning("jobs watch stopped (%s); restarting it", exc)
            await asyncio.sleep(self.settings.heartbeat_interval)

    async def _guard_jobs_watch(self) -> None:
        """Restart the jobs watch when the bucket moved on and the watch delivered nothing for
        a whole check interval: a KV watch can fall silent after a server restart, and a
        replica would then keep firing a deleted job or miss a new one."""
        stuck_at: int | None = None
        while not self._stopping:
            await asyncio.sleep(self.settings.jobs_watch_check)
            try:
                newest = await self._jobs_store.last_revision()
            except Exception as exc:
                log.debug("jobs bucket revision unknown: %s", exc)
                continue
            seen = self._jobs_revision
            if newest <= seen:
                stuck_at = None
                continue
            if stuck_at == seen:
                log.warning(
                    "jobs watch delivered nothing for %g s while the bucket moved from "
                    "revision %d to %d; restarting it",
                    self.settings.jobs_watch_check,
                    seen,
                    newest,
                )
                self._start_jobs_watch()
                stuck_at = None
                continue
            stuck_at = seen

    def _start_jobs_watch(self) -> None:
        if self._jobs_watch is not None:
            self._jobs_watch.cancel()
        self._jobs_watch = self._spawn(self._watch_jobs(), "jobs-watch")

    def _apply_job(self, event: JobEvent) -> None:
        spec = event.spec
        old = self.jobs.get(event.name)
        if spec is not None and not event.error:
            problems = spec.problems(
                prefix=self.settings.subject_prefix, max_payload=self.settings.max_payload
            )
            if spec.name != event.name:
                problems.insert(0, Problem("name", f"key {event.name!r} holds job {spec.name!r}"))
            if problems:
                event = JobEvent(event.name, None, event.revision, "; ".join(map(str, problems)))
        if event.error:
            log.warning("job %r skipped: %s", event.name, event.error)
            self._observer.bad_job(event.name, event.error)
        if old is not None and old.revision >= event.revision:
            return
        if event.error:
            self.skipped[event.name] = (event.revision, event.error)
        else:
            self.skipped.pop(event.name, None)
        if old is not None:
            self._digest ^= old.digest
            self._by_subject.pop(old.subject, None)
            old.entry += 1  # invalidates its heap entry; an in-flight act sees it too
            del self.jobs[event.name]
        if old is None or event.spec is None or event.error:
            # A job that (re)appears reads its run count again: deleting it may have reset it.
            self._counter.forget(event.name)
        if event.spec is None or event.error:
            return
        try:
            job = self._load_job(event, old)
        except (HrwcronError, ArithmeticError, ValueError) as exc:
            # A spec the rules let through but the engine cannot plan: one bad job, not a
            # jobs watch that fails and restarts on every replica.
            error = f"cannot be scheduled: {exc}"
            log.warning("job %r skipped: %s", event.name, error)
            self._observer.bad_job(event.name, error)
            self.skipped[event.name] = (event.revision, error)
            return
        self._digest ^= job.digest
        self.jobs[job.spec.name] = job
        self._owned_dirty.set()
        self._by_subject[job.subject] = job.spec.name
        if job.due is not None:
            if job.spec.max_runs is not None:
                self._read_count(job)
            self._push(job, job.due + job.jitter_ms)
        elif not job.spec.paused:
            self._ran_out(job)

    def _load_job(self, event: JobEvent, old: _Job | None) -> _Job:
        """The running form of a valid spec, its first due tick planned (None when paused)."""
        assert event.spec is not None
        spec = _compact(event.spec)
        subject = spec.trigger_subject(self.settings.subject_prefix)
        plan = spec.plan()
        job = _Job(
            spec=spec,
            schedule=plan.schedule,
            plan=plan,
            subject=subject,
            jitter_ms=jitter_ms(spec.name, spec.jitter),
            revision=event.revision,
            digest=xxhash.xxh3_64_intdigest(encode(spec)),
        )
        if spec.paused:
            return job
        same_schedule = (
            old is not None and old.due is not None and old.plan.identity == plan.identity
        )
        if same_schedule and old is not None:
            job.due = old.due
            job.acted = old.acted
        else:
            last = self.last.get(subject)
            job.due = first_due(
                job.plan,
                now_ms=self.clock.now_ms(),
                lateness_ms=spec.max_lateness_ms,
                last_done_ms=last.watermark if last else None,
                written_ms=event.written_ms,
            )
        self._collapse(job)
        return job

    # ------------------------------------------------------------------ trigger history

    async def _follow_triggers(self) -> None:
        while not self._stopping:
            try:
                seen_count = 0
                began = time.perf_counter()
                async for item in self._triggers.follow():
                    if item is None:
                        self._triggers_loaded.set()
                        continue
                    subject, seen = item
                    self._remember(subject, seen)
                    self._observer.trigger_seen(subject, seen)
                    seen_count += 1
                    if seen_count % CHECK_EVERY == 0 and time.perf_counter() - began > SLICE_S:
                        await asyncio.sleep(0)
                        began = time.perf_counter()
            except Exception as exc:
                log.warning("trigger feed stopped (%s); restarting it", exc)
            await asyncio.sleep(self.settings.heartbeat_interval)

    def _remember(self, subject: str, seen: LastTrigger) -> None:
        known = self.last.get(subject)
        if known is None or known.seq < seen.seq:
            self.last[subject] = seen
            name = self._by_subject.get(subject)
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

    def _done(self, job: _Job, due: int) -> LastTrigger | None:
        last = self.last.get(job.subject)
        return last if last is not None and last.watermark >= due else None

    # ------------------------------------------------------------------------ the timer

    def _push(self, job: _Job, at_ms: float) -> None:
        job.entry += 1
        heapq.heappush(self._heap, (at_ms, next(self._seq), job.spec.name, job.entry))
        if self._heap[0][0] == at_ms:
            self._wakeup.set()

    async def _timer_loop(self) -> None:
        heap = self._heap
        jobs = self.jobs
        while True:
            self._wakeup.clear()
            # Entries left behind (a tick resolved by the feed, a job pushed again) are dropped
            # here rather than waking the loop at their time for nothing: on this kind of
            # machine the wake-up, not the work, is what a spread-out tick costs most.
            while heap:
                _, _, name, entry = heap[0]
                job = jobs.get(name)
                if job is not None and job.entry == entry and not job.busy:
                    break
                heapq.heappop(heap)
            delay = 3600.0
            if heap:
                delay = (heap[0][0] - self.clock.now_ms()) / 1000
            if delay > 0:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation
                # that races with the event being set, and the loop would never stop.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(delay, 3600.0)):
                        await self._wakeup.wait()
                continue
            now = self.clock.now_ms()
            ready = self.ready  # once per batch: it reads the clock and every health sign
            popped = 0
            acts: list[Flight] = []
            # Bounded batches: the claims of the first due ticks go out while the rest of a
            # top-of-the-minute herd is still being evaluated.
            while heap and heap[0][0] <= now and popped < TIMER_BATCH:
                _, _, name, entry = heapq.heappop(heap)
                job = self.jobs.get(name)
                if job is not None and job.entry == entry and not job.busy:
                    self._evaluate(job, now, ready, acts)
                popped += 1
            if acts:
                self._dispatcher.submit(acts)
            await asyncio.sleep(0)  # a herd of due ticks must not starve the event loop

    def _place(self, job: _Job) -> None:
        """The job's owner and this replica's rank, computed once per change of the
        candidates."""
        if job.order_generation == self._generation:
            return
        plain = self._plain
        if plain is not None and not job.spec.tags:
            order = hrw.rank_prepared(job.spec.name, plain)
        else:
            order = ranking(job.spec.name, job.spec.tags, self._candidates)
        job.first = order[0] if order else None
        job.my_rank = order.index(self.node) if self.node in order else -1
        job.order_generation = self._generation

    def _evaluate(self, job: _Job, now: float, ready: bool, acts: list[Flight]) -> None:
        due = job.due
        if self._stopping:
            return
        if due is None:
            self._delete_when_due(job, now, ready)
            return
        if self._done(job, due):
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

    def holder_live(self, node: str, instance: str) -> bool:
        """Whether a claim holder is live and ready in the membership view: the same instance,
        ready, and heard from within a heartbeat (plus a margin)."""
        return self._holder_silent_in(node, instance) > 0

    def _holder_silent_in(self, node: str, instance: str) -> float:
        heard = self.view.heard(node)
        if heard is None:
            return 0.0
        heartbeat, seen_mono = heard
        if heartbeat.instance != instance or not heartbeat.ready:
            return 0.0
        return seen_mono + self._silence - self.clock.monotonic()

    def _holder_wait(self, held: HeldClaim) -> float | None:
        """When to look at a held claim again (server ms), or None to read it now: its
        holder fell silent, or the claim stayed unchanged for the whole lease."""
        lease_left = held.seen_mono + self.settings.claim_lease - self.clock.monotonic()
        silent_in = self._holder_silent_in(held.node, held.instance)
        if lease_left <= 0 or silent_in <= 0:
            return None
        return self.clock.now_ms() + min(lease_left, silent_in) * 1000 + 1

    def _acted(self, flight: Flight) -> None:
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
        self, job: _Job, outcome: str, due: int, rank: int, attempt: int, count: bool = True
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
            self._mark_bad(job, f"no next tick: {exc}")
            return
        self._collapse(job)
        if job.due is None:
            self._ran_out(job)
            return
        self._push(job, job.due + job.jitter_ms)

    def _collapse(self, job: _Job) -> None:
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

    def _ran_out(self, job: _Job) -> None:
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

    def _delete_when_due(self, job: _Job, now: float, ready: bool) -> None:
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

    async def _delete_finished(self, job: _Job) -> None:
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

    def _out_of_runs(self, job: _Job, now: float) -> bool:
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

    def _read_count(self, job: _Job) -> None:
        def loaded() -> None:
            if self.jobs.get(job.spec.name) is job:
                self._mirror_count(job)
                if job.due is not None and not job.busy:
                    self._push(job, 0)

        self._counter.read(job.spec.name, loaded)

    def _mirror_count(self, job: _Job, *, published: bool = False) -> None:
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

    def _claim_ttl(self, job: _Job) -> float:
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
                await self._claims.release(claim_key, flight.revision)
        self._observer.outcome(name, outcome, due_ms=due_ms, rank=0, attempt=1, lateness_ms=None)
        if outcome == "error":
            raise StoreUnavailable(f"trigger {msg_id}: {flight.error}")
        return outcome

    # ------------------------------------------------------------------- failing jobs

    def _mark_bad(self, job: _Job, problem: str) -> None:
        """A job whose ticks fail for what it is: shown in status, logged once."""
        if problem != job.problem:
            log.warning("job %r: %s", job.spec.name, problem)
        job.problem = problem

    def _log_error(self, job: _Job, tick_key: str, error: str) -> None:
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
        self._started_ms = int(self.clock.local_ms())
        gc.freeze()  # what the process set up so far stays too: no full collection walks it
        await self._beat(first=True)
        self._beat_ok = self.clock.monotonic()
        self.view.replace_all(await self._members.snapshot())
        self._view_ok = self.clock.monotonic()
        # Membership first: loading a large job set can outlast the member TTL.
        self._spawn(self._watch_members(), "members-watch")
        self._spawn(self._refresh_loop(), "members-refresh")
        self._spawn(self._heartbeat_loop(), "heartbeat")
        self._spawn(self._follow_triggers(), "trigger-feed")
        await _wait_event(self._triggers_loaded, 30, "trigger history")
        self._start_jobs_watch()
        await _wait_event(self._jobs_loaded, 60, "job list")
        self._spawn(self._guard_jobs_watch(), "jobs-watch-guard")
        self._spawn(self._timer_loop(), "timer")
        self._spawn(self._owned_loop(), "owned-count")
        self._refresh_candidates()

    async def stop(self, timeout: float | None = None) -> None:
        """Stop claiming, let in-flight publishes finish, then leave the membership; all of
        it within ``timeout`` (``shutdown_timeout``), whatever state the connection is in."""
        timeout = self.settings.shutdown_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout

        def left(most: float) -> float:
            return max(0.05, min(most, deadline - loop.time()))

        self._stopping = True
        with contextlib.suppress(Exception):
            # Announce "not ready" at once, so the others stop waiting for this replica's turn.
            await asyncio.wait_for(self._beat(), timeout=left(min(1.0, timeout / 4)))
        self._queued_acts.clear()
        batches = self._dispatcher.tasks
        if batches:
            # Keep a second for cancelling the rest and leaving the membership.
            await asyncio.wait(set(batches), timeout=left(deadline - loop.time() - 1.0))
        await _cancel_all([*self._tasks, *batches], left(0.5))
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._members.deregister(self.node), timeout=left(0.5))

    async def _owned_loop(self) -> None:
        """Counts owned jobs after membership or job changes, in slices, so even 100,000 jobs
        neither stall the loop nor cost CPU while nothing changes."""
        while True:
            await self._owned_dirty.wait()
            self._owned_dirty.clear()
            candidates = self._candidates
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
        return self._jobs_revision

    def job_on_subject(self, subject: str) -> str | None:
        """The loaded job that publishes on ``subject``, if any."""
        return self._by_subject.get(subject)

    def ranking_of(self, name: str) -> list[str]:
        job = self.jobs.get(name)
        return ranking(name, job.spec.tags if job else [], self._candidates)

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


_NO_TAGS: list[str] = []


def _compact(spec: JobSpec) -> JobSpec:
    """Share what most of 100,000 decoded specs hold alike (schedule text, zone, no tags)
    instead of keeping a copy per job: about 150 bytes a job. Nothing mutates a spec."""
    spec.schedule = sys.intern(spec.schedule)
    spec.tz = sys.intern(spec.tz)
    if not spec.tags:
        spec.tags = _NO_TAGS
    return spec


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
