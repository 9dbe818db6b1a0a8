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

from hrwcron.core.errors import HrwcronError, Problem
from hrwcron.core.model import JobSpec, encode
from hrwcron.core.plan import TickPlan
from hrwcron.core.planner import first_due
from hrwcron.core.schedule import Schedule, jitter_ms
from hrwcron.engine.clock import Clock
from hrwcron.engine.pacing import Slices
from hrwcron.engine.ports import JobEvent, JobsPort, LastTrigger, Observer
from hrwcron.engine.settings import Settings

log = logging.getLogger("hrwcron.scheduler")

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


class JobHooks(Protocol):
    """What the engine does when the table changes."""

    def prepare(self, job: Job) -> None:
        """A job about to be loaded, its first due tick planned (may raise: the job is skipped)."""

    def loaded(self, job: Job) -> None:
        """A job is in the table now."""

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
        self.digest = 0  # xor of the loaded specs' hashes: equal across agreeing replicas
        self.revision = 0  # newest jobs-bucket revision the watch delivered
        self.loaded = asyncio.Event()
        self.stopping = False
        self._watch: asyncio.Task[None] | None = None

    # --------------------------------------------------------------------------- the watch

    def start_watch(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
        self._watch = self._spawn(self._follow(), "jobs-watch")

    async def _follow(self) -> None:
        while not self.stopping:
            try:
                # The initial state read after this covers every revision up to here, even
                # one whose message is gone (a removed delete marker): the guard must not
                # take that gap for a silent watch.
                covered = 0
                with contextlib.suppress(Exception):
                    covered = await self._store.last_revision()
                slices = Slices()
                async for event in self._store.watch():
                    if event is None:
                        if not self.loaded.is_set():
                            log.info("loaded %d jobs", len(self.jobs))
                            gc.freeze()
                        self.loaded.set()
                        self.revision = max(self.revision, covered)
                        continue
                    self.revision = max(self.revision, event.revision)
                    self.apply(event)
                    if slices.spent():
                        await asyncio.sleep(0)
                    if slices.count % FREEZE_EVERY == 0 and not self.loaded.is_set():
                        gc.freeze()
            except Exception as exc:
                log.warning("jobs watch stopped (%s); restarting it", exc)
            await asyncio.sleep(self.settings.heartbeat_interval)

    async def guard(self) -> None:
        """Restart the jobs watch when the bucket moved on and the watch delivered nothing for
        a whole check interval: a KV watch can fall silent after a server restart, and a
        replica would then keep firing a deleted job or miss a new one."""
        stuck_at: int | None = None
        while not self.stopping:
            await asyncio.sleep(self.settings.jobs_watch_check)
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

    def apply(self, event: JobEvent) -> None:
        """Take one change of the jobs bucket: load, replace or drop the job."""
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
            job = self._load(event, old)
            self._hooks.prepare(job)
        except (HrwcronError, ArithmeticError, ValueError) as exc:
            # A spec the rules let through but the engine cannot plan: one bad job, not a
            # jobs watch that fails and restarts on every replica.
            error = f"cannot be scheduled: {exc}"
            log.warning("job %r skipped: %s", event.name, error)
            self._observer.bad_job(event.name, error)
            self.skipped[event.name] = (event.revision, error)
            if old is not None:
                self._hooks.removed(old)
            return
        self.digest ^= job.digest
        self.jobs[job.spec.name] = job
        self.by_subject[job.subject] = job.spec.name
        self._hooks.loaded(job)

    def _load(self, event: JobEvent, old: Job | None) -> Job:
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
                now_ms=self._clock.now_ms(),
                lateness_ms=spec.max_lateness_ms,
                last_done_ms=last.watermark if last else None,
                written_ms=event.written_ms,
            )
        return job


_NO_TAGS: list[str] = []


def _compact(spec: JobSpec) -> JobSpec:
    """Share what most of 100,000 decoded specs hold alike (schedule text, zone, no tags)
    instead of keeping a copy per job: about 150 bytes a job. Nothing mutates a spec."""
    spec.schedule = sys.intern(spec.schedule)
    spec.tz = sys.intern(spec.tz)
    if not spec.tags:
        spec.tags = _NO_TAGS
    return spec
