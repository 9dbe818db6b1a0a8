"""One replica's view of the run counts of max_runs jobs (the rule is in core/run_limits.py).

The engine asks three things of it: how many runs a job has used (None until its durable copy
was read: the engine then fails closed and looks again), which ``Hrwcron-Run`` number a
trigger carries, and to raise the durable copy when a trigger carries a number above it. Reads
and writes run as background tasks, at most one of each per job at a time, so the tick path
never waits on them (except a publish for a job whose copy was never read: :meth:`load`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import Any

from hrwcron.core.run_limits import RunCount, next_run, runs_done
from hrwcron.engine.ports import CountsPort

log = logging.getLogger("hrwcron.scheduler")

Spawn = Callable[[Coroutine[Any, Any, None], str], object]


class RunCounter:
    def __init__(self, port: CountsPort | None, spawn: Spawn) -> None:
        self._port = port
        self._spawn = spawn
        self._known: dict[str, RunCount] = {}
        self._reading: set[str] = set()
        self._writing: set[str] = set()

    def forget(self, job: str) -> None:
        """Read the job's copy again when next asked: deleting a job may have reset it."""
        self._known.pop(job, None)

    def done(self, job: str, last_run: int) -> int | None:
        """Runs used, given the run number of the newest trigger on the job's subject; None
        until the durable copy has been read."""
        record = self._known.get(job)
        return None if record is None else runs_done(record, last_run)

    def read(self, job: str, loaded: Callable[[], None]) -> None:
        """Read the durable copy unless it is known or being read; ``loaded`` runs after."""
        if job in self._known or job in self._reading:
            return
        if self._port is None:
            self._known[job] = RunCount()  # no durable copy: the stream's numbers only
            return
        self._reading.add(job)
        self._spawn(self._fetch(job, loaded), f"count-{job}")

    async def _fetch(self, job: str, loaded: Callable[[], None]) -> None:
        assert self._port is not None
        try:
            stored = await self._port.get(job)
        except Exception as exc:
            log.warning("run count of %s not readable (%s); retrying", job, exc)
            return
        finally:
            self._reading.discard(job)
        self._learn(job, stored or RunCount())
        loaded()

    def _learn(self, job: str, record: RunCount) -> None:
        known = self._known.get(job)
        self._known[job] = record if known is None else known.merged(record)

    def behind(self, job: str, last_run: int) -> bool:
        """Whether the durable copy (as known here) is below the newest trigger's number."""
        record = self._known.get(job)
        return self._port is not None and record is not None and last_run > record.total

    def mirror(self, job: str, last_run: int, again: Callable[[], None]) -> None:
        """Raise the durable copy to ``last_run`` in the background; ``again`` runs after a
        write, since a newer trigger may have arrived meanwhile."""
        if not self.behind(job, last_run) or job in self._writing:
            return
        self._writing.add(job)
        self._spawn(self._write(job, last_run, again), f"count-write-{job}")

    async def _write(self, job: str, total: int, again: Callable[[], None]) -> None:
        assert self._port is not None
        try:
            stored = await self._port.raise_total(job, total)
        except Exception as exc:
            log.warning("run count of %s not saved (%s); the next trigger retries", job, exc)
            return
        finally:
            self._writing.discard(job)
        if job in self._known:
            self._learn(job, stored)
        again()

    def known(self, job: str) -> bool:
        return job in self._known

    async def load(self, job: str) -> None:
        """Read the durable copy now, for a publish that cannot go without it."""
        if job not in self._known:
            stored = await self._port.get(job) if self._port is not None else None
            self._learn(job, stored or RunCount())

    def run_number(self, job: str, last_run: int, max_runs: int, scheduled: bool) -> int | None:
        """The run number of a trigger fenced against a predecessor numbered ``last_run``;
        None when a scheduled tick would exceed ``max_runs``. The copy must be known (see
        :meth:`load`)."""
        return next_run(self._known[job], last_run, max_runs, scheduled)

    async def reset(self, job: str, last_run: int) -> None:
        """Start a deleted job's count again; nothing to do for one that never counted."""
        if self._port is None:
            return
        stored = await self._port.get(job)
        total = max(last_run, stored.total if stored else 0)
        if stored is None and total == 0:
            return
        await self._port.reset(job, total)
        self.forget(job)
