"""The engine's parts on their own, for its unit tests: a job table with hooks that record what
it tells the engine, job events, jobs and flights built by hand, a settable wall clock beside a
monotonic one, and the replica state membership reads."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from hrwcron.adapters.memory import MemoryJobs
from hrwcron.core.errors import HrwcronError
from hrwcron.core.model import JobSpec
from hrwcron.engine.clock import Clock
from hrwcron.engine.flight import Flight
from hrwcron.engine.jobs import Job, JobTable
from hrwcron.engine.ports import JobEvent, LastTrigger, NullObserver
from hrwcron.engine.settings import Settings

__all__ = [
    "DUE",
    "LONGEST_NAME",
    "Clocks",
    "Hooks",
    "Spawned",
    "State",
    "event",
    "flights",
    "job",
    "table",
]

DUE = 1_772_953_800_000
LONGEST_NAME = ".".join(["n" * 64] * 8)


class Hooks:
    """Records what the table told the engine; refuses to plan the jobs named in ``refuse``."""

    def __init__(self) -> None:
        self.prepared: list[str] = []
        self.loaded_jobs: list[Job] = []
        self.unknown: list[str] = []
        self.removed_jobs: list[str] = []
        self.refuse: set[str] = set()

    def prepare(self, job: Job) -> None:
        if job.spec.name in self.refuse:
            raise HrwcronError("no tick can be planned")
        self.prepared.append(job.spec.name)

    def loaded(self, job: Job, *, created: bool = False) -> None:
        self.loaded_jobs.append(job)

    def runs_unknown(self, name: str) -> None:
        self.unknown.append(name)

    def removed(self, job: Job) -> None:
        self.removed_jobs.append(job.spec.name)


class Spawned:
    def __init__(self) -> None:
        self.tasks: list[asyncio.Task[None]] = []

    def __call__(self, coro: Any, name: str) -> asyncio.Task[None]:
        task = asyncio.create_task(coro, name=name)
        self.tasks.append(task)
        return task


def table(
    last: dict[str, LastTrigger] | None = None, store: MemoryJobs | None = None
) -> tuple[JobTable, Hooks, Spawned]:
    hooks, spawned = Hooks(), Spawned()
    jobs = JobTable(
        Settings(node_id="a", heartbeat_interval=0.05),
        store or MemoryJobs(),
        observer=NullObserver(),
        clock=Clock(),
        last=last or {},
        hooks=hooks,
        spawn=spawned,
    )
    return jobs, hooks, spawned


def event(name: str, revision: int, **kwargs: Any) -> JobEvent:
    return JobEvent(name, JobSpec(name=name, schedule="@every 1m", **kwargs), revision)


class Clocks:
    """A settable wall clock and a monotonic clock that only moves forward with real time."""

    def __init__(self) -> None:
        self.real_ms = 1_800_000_000_000.0
        self.wall_offset_ms = 0.0
        self.suspended_ms = 0.0  # time the monotonic clock did not count

    def wall(self) -> float:
        return self.real_ms + self.wall_offset_ms

    def monotonic(self) -> float:
        return (self.real_ms - self.suspended_ms) / 1000 - 1_700_000_000

    def advance(self, ms: float) -> None:
        self.real_ms += ms


@dataclass
class State:
    stopping: bool = False
    loading: bool = False
    digest: str = "00000000000000aa"
    job_count: int = 0


def job(name: str = "reports.daily", payload: Any = None, max_runs: int | None = None) -> Job:
    spec = JobSpec(name=name, schedule="@every 1m", payload=payload, max_runs=max_runs)
    plan = spec.plan()
    return Job(spec, plan.schedule, plan, spec.trigger_subject("hrwcron.trigger"), 0, 1, 0)


def flights() -> list[Flight]:
    scheduled = Flight(job(payload={"format": "pdf", "to": ["a", "b"]}), 0, DUE, 0)
    scheduled.watermark = DUE
    manual = Flight(job("ops.poke"), 0, DUE + 17, 0, "manual", "ops.poke:manual:x-1", "c")
    backfill = Flight(job("billing", payload=[1, None]), 0, DUE - 60_000, 0, "backfill")
    counted = Flight(job("batches", max_runs=6), 0, DUE, 0)
    counted.run = 3
    longest = Flight(job(LONGEST_NAME), 0, 221_845_391_999_999, 0)
    longest.attempt = 7
    return [scheduled, manual, backfill, counted, longest]
