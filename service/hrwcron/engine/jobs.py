"""The job table: every stored job this replica runs, kept current by a watch on the jobs bucket.

It validates each spec it sees, plans the job's first due tick, keeps the digest the replicas
compare, and tells the engine through :class:`JobHooks` what to do with a job it loaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import sys
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import xxhash

from hrwcron.core import partitions
from hrwcron.core.errors import HrwcronError, Problem
from hrwcron.core.model import JobSpec, encode
from hrwcron.core.plan import TickPlan
from hrwcron.core.schedule import Schedule, jitter_ms
from hrwcron.core.turns import first_due
from hrwcron.engine.clock import Clock
from hrwcron.engine.pacing import Slices
from hrwcron.engine.ports import Covered, JobEvent, JobsPort, LastTrigger, Observer
from hrwcron.engine.settings import Settings

log = logging.getLogger("hrwcron.scheduler")

# The longest pause between attempts to restart a jobs watch that keeps failing.
WATCH_BACKOFF_S = 16.0
# Jobs loaded at start-up live as long as the replica. Every so many of them they are moved out
# of the cyclic garbage collector's sight (gc.freeze): otherwise each full collection walks all
# of them, tens of milliseconds of stalled loop at 100,000 jobs.
FREEZE_EVERY = 5_000


@dataclass(frozen=True, slots=True)
class HeldClaim:
    """A claim seen held by another instance: what the tick waits on instead of polling."""

    revision: int
    seen_mono: float  # when this replica first saw this revision (lease clock)
    node: str
    instance: str


@dataclass(slots=True, eq=False)
class Job:
    spec: JobSpec
    schedule: Schedule
    plan: TickPlan
    subject: str
    jitter_ms: int
    revision: int
    digest: int
    # Where it is stored, when that is not its lane's key (``stored_key``): a move between
    # keys must not drop it. Empty for most jobs: a million of them need no copy each.
    key: str = ""
    lane: str = ""  # its lane (core/partitions.py)
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

    @property
    def stored_key(self) -> str:
        return self.key or f"{partitions.KEY_PREFIX}{self.lane}.{self.spec.name}"


class JobHooks(Protocol):
    """What the engine does when the table changes."""

    def prepare(self, job: Job) -> None:
        """A job about to be loaded, its first due tick planned (may raise: the job is skipped)."""

    def loaded(self, job: Job, *, created: bool = False) -> None:
        """A job is in the table now; ``created``: it was written to the bucket after this
        replica began watching its lane, so its subject holds no trigger of its own ticks."""

    def runs_unknown(self, name: str) -> None:
        """A job appeared or went away: its run count must be read again."""

    def removed(self, job: Job) -> None:
        """A job left the table (deleted, or replaced by a spec that cannot be loaded)."""


class JobTable:
    """The loaded jobs by name and by trigger subject, and the specs that were skipped."""

    def __init__(
        self,
        settings: Settings,
        store: JobsPort,
        *,
        observer: Observer,
        clock: Clock,
        last: Mapping[str, LastTrigger],
        hooks: JobHooks,
        spawn: Callable[[Coroutine[Any, Any, None], str], asyncio.Task[None]],
    ) -> None:
        self.settings = settings
        self._store = store
        self._observer = observer
        self._clock = clock
        self._last = last
        self._hooks = hooks
        self._spawn = spawn
        self.jobs: dict[str, Job] = {}
        self.by_subject: dict[str, str] = {}
        # Stored specs this replica did not load: (revision, why).
        self.skipped: dict[str, tuple[int, str]] = {}
        self._skipped_lanes: dict[str, tuple[str, str]] = {}  # name -> (key, lane) of a skip
        self.digest = 0  # xor of the loaded specs' hashes: equal across agreeing replicas
        self.revision = 0  # newest jobs-bucket revision the watch delivered
        self.loaded = asyncio.Event()
        self.applied = 0  # changes taken from the watches: start-up waits while this moves
        self.stopping = False
        self._watch: asyncio.Task[None] | None = None
        # The lanes this replica holds (None: every job), and the watches that deliver them:
        # the first one, then one per set of lanes taken on since.
        self.held: frozenset[str] | None = None
        self._lane_watches: dict[asyncio.Task[None], frozenset[str]] = {}
        self._catching_up: set[asyncio.Task[None]] = set()
        self._covered: dict[asyncio.Task[None], int] = {}  # what each watch has delivered

    # --------------------------------------------------------------------------- the watch

    def start_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        for task in self._lane_watches:
            task.cancel()
        self._lane_watches.clear()
        self._catching_up.clear()
        self._covered.clear()
        self._watch = self._spawn(self._follow(self.held), "jobs-watch")

    @property
    def catching_up(self) -> bool:
        """Whether jobs of lanes taken on since the start are still being read."""
        return bool(self._catching_up)

    def hold(self, lanes: frozenset[str] | None) -> None:
        """Hold only the jobs of ``lanes`` from now on: drop the others, read the new ones."""
        before = self.held
        self.held = lanes
        if self._watch is None or lanes == before:
            return  # not started: the first watch reads what is held then
        if lanes is None or before is None:
            self.start_watch()  # everything, or from everything to a share: read again
            if lanes is not None:
                self._drop_unheld()
            return
        if before - lanes:
            self._drop_unheld()
            for task, covered in list(self._lane_watches.items()):
                if not covered & lanes:
                    task.cancel()
                    del self._lane_watches[task]
                    self._catching_up.discard(task)
                    self._covered.pop(task, None)
        added = lanes - before
        if added:
            task = self._spawn(self._follow(added), "jobs-watch-lanes")
            self._lane_watches[task] = added
            self._catching_up.add(task)

    def lane_of(self, name: str) -> str | None:
        """The lane of a stored job this replica holds (loaded or skipped)."""
        job = self.jobs.get(name)
        if job is not None:
            return job.lane
        skipped = self._skipped_lanes.get(name)
        return skipped[1] if skipped is not None else None

    def _drop_unheld(self) -> None:
        held = self.held
        if held is None:
            return
        gone = [job for job in self.jobs.values() if job.lane not in held]
        for job in gone:
            self._drop(job)
        for name in [n for n, (_, lane) in self._skipped_lanes.items() if lane not in held]:
            self._skipped_lanes.pop(name, None)
            self.skipped.pop(name, None)
        if gone:
            log.info("gave up %d jobs of lanes other replicas hold now", len(gone))

    def _drop(self, job: Job) -> None:
        self.digest ^= job.digest
        self.by_subject.pop(job.subject, None)
        job.entry += 1
        del self.jobs[job.spec.name]
        self._hooks.runs_unknown(job.spec.name)
        self._hooks.removed(job)

    def _cover(self, task: asyncio.Task[None] | None, revision: int) -> None:
        """A watch delivered every change up to ``revision``. Holding a share, the table
        holds every change up to the least of its watches' revisions."""
        if task is None:
            return
        self._covered[task] = revision
        if self.held is None:
            self.revision = max(self.revision, revision)
            return
        watches = [self._watch, *self._lane_watches]
        self.revision = min(self._covered.get(t, 0) for t in watches if t is not None)

    async def _follow(self, lanes: frozenset[str] | None) -> None:
        task = asyncio.current_task()
        first = task is self._watch
        if lanes is not None and len(lanes) > partitions.PARTITIONS:
            lanes = None  # every lane: one watch of the whole bucket is cheaper than filters
        failures = 0
        while not self.stopping:
            try:
                # The initial state read after this covers every revision up to here, even
                # one whose message is gone (a removed delete marker): the guard must not
                # take that gap for a silent watch.
                covered = 0
                with contextlib.suppress(Exception):
                    covered = await self._store.last_revision()
                slices = Slices()
                live = False  # past the watch's initial state: each change as it is made
                async for event in self._store.watch(lanes):
                    if event is None:
                        live = True
                        failures = 0  # this one got through
                        if first and not self.loaded.is_set():
                            log.info("loaded %d jobs", len(self.jobs))
                            gc.freeze()
                        if first:
                            self.loaded.set()
                            if self.held is None:
                                self.revision = max(self.revision, covered)
                        elif task in self._catching_up:
                            self._catching_up.discard(task)
                            log.info("took on %d lanes of jobs", len(lanes or ()))
                        continue
                    if isinstance(event, Covered):
                        self._cover(task, event.revision)
                        continue
                    if self.held is None:
                        self.revision = max(self.revision, event.revision)
                    self.apply(event, live=live)
                    self.applied += 1
                    if slices.spent():
                        await asyncio.sleep(0)
                    if slices.count % FREEZE_EVERY == 0 and not self.loaded.is_set():
                        gc.freeze()
            except Exception as exc:
                failures += 1
                log.warning("jobs watch stopped (%s); restarting it", exc)
            # A server that times out watches is busy: each restart reads the lanes again, so
            # the restarts back off (doubling, up to WATCH_BACKOFF_S) until one gets through.
            pause = self.settings.heartbeat_interval * 2 ** max(0, failures - 1)
            await asyncio.sleep(min(pause, WATCH_BACKOFF_S))

    async def guard(self) -> None:
        """Restart the jobs watch when the bucket moved on and the watch delivered nothing for
        a whole check interval: a KV watch can fall silent after a server restart, and a
        replica would then keep firing a deleted job or miss a new one."""
        stuck_at: int | None = None
        while not self.stopping:
            await asyncio.sleep(self.settings.jobs_watch_check)
            if self.held is not None:
                # Holding a share, the bucket moves in lanes this replica never sees: the
                # watches' ordered consumers notice a silent server themselves.
                continue
            try:
                newest = await self._store.last_revision()
            except Exception as exc:
                log.debug("jobs bucket revision unknown: %s", exc)
                continue
            seen = self.revision
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
                self.start_watch()
                stuck_at = None
                continue
            stuck_at = seen

    # ------------------------------------------------------------------------ one change

    def _lane(self, event: JobEvent, old: Job | None) -> str:
        # Interned: a few thousand lanes shared by every job instead of a copy apiece.
        lane, _ = partitions.split_key(event.key or event.name)
        if lane is not None:
            return sys.intern(lane)
        if event.spec is not None:  # stored before lanes: its lane follows from the spec
            return sys.intern(partitions.lane_of(event.name, event.spec.tags))
        return old.lane if old is not None else sys.intern(partitions.lane_of(event.name, ()))

    def apply(self, event: JobEvent, *, live: bool = False) -> None:
        """Take one change of the jobs bucket: load, replace or drop the job. ``live``: the
        change came as it was made, after the watch's initial state."""
        old = self.jobs.get(event.name)
        key = event.key or event.name
        lane = self._lane(event, old)
        if old is not None and old.stored_key != key:
            if old.revision >= event.revision:
                return  # an older copy under another key (a move between lanes)
            if event.spec is None and not event.error:
                return  # the copy a move left behind is gone; the job stays where it went
        if self.held is not None and lane not in self.held:
            if old is not None and old.stored_key == key and old.revision < event.revision:
                self._drop(old)  # moved to a lane held elsewhere (a bucket without lanes)
            return
        spec = event.spec
        if spec is not None and not event.error:
            problems = spec.problems(
                prefix=self.settings.subject_prefix, max_payload=self.settings.max_payload
            )
            if spec.name != event.name:
                problems.insert(0, Problem("name", f"key {key!r} holds job {spec.name!r}"))
            if problems:
                event = JobEvent(
                    event.name, None, event.revision, "; ".join(map(str, problems)), key=key
                )
        if event.error:
            log.warning("job %r skipped: %s", event.name, event.error)
            self._observer.bad_job(event.name, event.error)
        if old is not None and old.revision >= event.revision:
            return
        if event.error:
            self.skipped[event.name] = (event.revision, event.error)
            self._skipped_lanes[event.name] = (key, lane)
        elif self._skipped_lanes.get(event.name, (key, ""))[0] == key:
            self.skipped.pop(event.name, None)
            self._skipped_lanes.pop(event.name, None)
        if old is not None:
            self.digest ^= old.digest
            self.by_subject.pop(old.subject, None)
            old.entry += 1  # invalidates its heap entry; an in-flight act sees it too
            del self.jobs[event.name]
        if old is None or event.spec is None or event.error:
            # A job that (re)appears reads its run count again: deleting it may have reset it.
            self._hooks.runs_unknown(event.name)
        if event.spec is None or event.error:
            if old is not None:
                self._hooks.removed(old)
            return
        try:
            job = self._load(event, old, key, lane)
            self._hooks.prepare(job)
        except (HrwcronError, ArithmeticError, ValueError) as exc:
            # A spec the rules let through but the engine cannot plan: one bad job, not a
            # jobs watch that fails and restarts on every replica.
            error = f"cannot be scheduled: {exc}"
            log.warning("job %r skipped: %s", event.name, error)
            self._observer.bad_job(event.name, error)
            self.skipped[event.name] = (event.revision, error)
            self._skipped_lanes[event.name] = (key, lane)
            if old is not None:
                self._hooks.removed(old)
            return
        self.digest ^= job.digest
        self.jobs[job.spec.name] = job
        self.by_subject[job.subject] = job.spec.name
        self._hooks.loaded(job, created=live and old is None)

    def _load(self, event: JobEvent, old: Job | None, key: str, lane: str) -> Job:
        """The running form of a valid spec, its first due tick planned (None when paused)."""
        assert event.spec is not None
        spec = _compact(event.spec)
        subject = spec.trigger_subject(self.settings.subject_prefix)
        plan = spec.plan()
        job = Job(
            spec=spec,
            schedule=plan.schedule,
            plan=plan,
            subject=subject,
            jitter_ms=jitter_ms(spec.name, spec.jitter),
            revision=event.revision,
            digest=xxhash.xxh3_64_intdigest(encode(spec)),
            key="" if key == f"{partitions.KEY_PREFIX}{lane}.{spec.name}" else key,
            lane=lane,
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
            last = self._last.get(subject)
            job.due = first_due(
                job.plan,
                now_ms=self._clock.earliest_ms(self.settings.max_clock_skew_ms),
                lateness_ms=spec.max_lateness_ms,
                last_done_ms=last.watermark if last else None,
                written_ms=event.written_ms,
            )
        return job


_NO_TAGS: list[str] = []
_NO_EXCLUSIONS: list[str] = []


def _compact(spec: JobSpec) -> JobSpec:
    """Share what most of 100,000 decoded specs hold alike (schedule text, zone, no tags, no
    exclusions) instead of keeping a copy per job: about 200 bytes a job. Nothing mutates a
    spec."""
    spec.schedule = sys.intern(spec.schedule)
    spec.tz = sys.intern(spec.tz)
    if not spec.tags:
        spec.tags = _NO_TAGS
    if not spec.exclude:
        spec.exclude = _NO_EXCLUSIONS
    return spec
