"""Faults on replica processes, and an audit of the trigger stream against the invariants.

Two halves, usable separately:

* :class:`ReplicaFleet` runs ``python -m hrwcron run`` replicas against real servers and injects
  the process faults the protocol must survive: ``kill`` (SIGKILL), ``pause``/``resume``
  (SIGSTOP/SIGCONT), ``restart``, and failpoints armed through the environment.
* :class:`TriggerLog` reads the whole trigger stream, headers and server timestamps included, and
  :meth:`TriggerLog.check_exactly_once` (or the pure :func:`find_violations`, in ``audit.py``)
  lists every way it breaks the invariants (ARCHITECTURE.md) for a set of jobs: a tick missing,
  duplicated, published before its fire instant or after its lateness deadline (both by the
  server's clock), a stray Msg-Id, a job's ticks out of due order, or a tick its window,
  exclusions or ``max_runs`` rule out.

Scenario tests (and the long chaos runs) drive the faults, then assert that the violation list
is empty; a violation's ``str`` says which tick and why, so a failure reads as a diagnosis.
Times are epoch milliseconds throughout. The servers run on this host, so the test process's
wall clock is the servers' clock (unless a replica is put under libfaketime on purpose).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import msgspec
import nats.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy

from hrwcron.core.config import Config, load_config
from hrwcron.core.model import JobSpec

from .audit import (
    DUPLICATED,
    EARLY,
    EXCLUDED,
    LATE,
    MISSING,
    OUT_OF_ORDER,
    OUTSIDE,
    RUNS,
    STRAY,
    Violation,
    due_instants,
    find_violations,
)
from .commands import HARNESS_ENV
from .procs import ReplicaProcess
from .timings import QUICK, Timings
from .wait import wait_for_async

__all__ = [
    "DEFAULT_PREFIX",
    "DEFAULT_STREAM",
    "DUPLICATED",
    "EARLY",
    "EXCLUDED",
    "LATE",
    "MISSING",
    "OUTSIDE",
    "OUT_OF_ORDER",
    "RUNS",
    "STRAY",
    "ReplicaFleet",
    "Trigger",
    "TriggerLog",
    "Violation",
    "describe",
    "due_instants",
    "find_violations",
    "now_ms",
    "parse_trigger",
    "summary",
    "wait_until_ms",
]

DEFAULT_STREAM = "HRWCRON_TRIGGERS"
DEFAULT_PREFIX = "hrwcron.trigger"


def now_ms() -> float:
    return time.time() * 1000


async def wait_until_ms(instant_ms: float, *, what: str = "instant") -> None:
    """Let time pass until ``instant_ms`` (wall clock): for scenarios whose fault must last a
    given time (an outage longer than a TTL), not for waiting on a state, which
    ``wait_for_async`` does."""
    timeout = max(0.0, (instant_ms - now_ms()) / 1000) + 5.0
    await wait_for_async(
        lambda: now_ms() >= instant_ms, timeout=timeout, interval=0.02, message=what
    )


# --- the trigger stream ---------------------------------------------------------------------


class _Body(msgspec.Struct):
    job: str = ""
    due_ms: int = 0
    node: str = ""
    attempt: int = 0
    kind: str = "scheduled"


@dataclass(frozen=True)
class Trigger:
    """One message of the trigger stream as the server stored it."""

    seq: int
    subject: str
    msg_id: str
    job: str
    due_ms: int
    stored_ms: float  # the server's timestamp of the message
    node: str
    attempt: int
    kind: str
    headers: Mapping[str, str] = field(repr=False)

    @property
    def scheduled(self) -> bool:
        return self.kind == "scheduled"

    @property
    def lateness_ms(self) -> float:
        """Server-stored time minus the nominal due instant (jitter not subtracted)."""
        return self.stored_ms - self.due_ms


def parse_trigger(
    seq: int, subject: str, data: bytes, headers: Mapping[str, str] | None, stored_ms: float
) -> Trigger:
    """A stored message as a :class:`Trigger`; also fits the in-memory stream's records."""
    found = dict(headers or {})
    try:
        body = msgspec.json.decode(data, type=_Body)
    except msgspec.MsgspecError:
        body = _Body()
    return Trigger(
        seq=seq,
        subject=subject,
        msg_id=found.get("Nats-Msg-Id", ""),
        job=found.get("Hrwcron-Job", body.job),
        due_ms=body.due_ms,
        stored_ms=stored_ms,
        node=body.node,
        attempt=body.attempt,
        kind=found.get("Hrwcron-Kind", body.kind),
        headers=found,
    )


def _trigger(msg: Msg) -> Trigger:
    meta = msg.metadata
    return parse_trigger(
        int(meta.sequence.stream),
        msg.subject,
        msg.data,
        msg.headers,
        meta.timestamp.timestamp() * 1000,
    )


class TriggerLog:
    """Every message of the trigger stream, read incrementally over a test's connection.

    ``await log.read()`` fetches what was appended since the last call (a fresh ordered consumer
    from the next sequence each time, so nothing is left running between reads) and returns the
    whole log so far. ``triggers`` is in stream order.
    """

    def __init__(
        self,
        client: Client,
        *,
        stream: str = DEFAULT_STREAM,
        subject_prefix: str = DEFAULT_PREFIX,
    ) -> None:
        self.client = client
        self.stream = stream
        self.subjects = f"{subject_prefix}.>"
        self.triggers: list[Trigger] = []
        self._newest: dict[str, int] = {}  # job -> newest scheduled due read so far

    @property
    def next_seq(self) -> int:
        return self.triggers[-1].seq + 1 if self.triggers else 1

    async def read(self, timeout: float = 30.0) -> list[Trigger]:
        """Everything stored up to the stream's last sequence at the time of the call.

        Raises TimeoutError (nats-py's included) when the stream does not answer in time, as
        during a leader election: nothing is lost, the next call reads on from the same place.
        """
        js = self.client.jetstream()
        info = await js.stream_info(self.stream)
        last = int(info.state.last_seq or 0)
        start = max(self.next_seq, int(info.state.first_seq or 1))
        if last < start:
            return self.triggers
        done = asyncio.Event()
        fresh: list[Trigger] = []

        async def deliver(msg: Msg) -> None:
            trigger = _trigger(msg)
            if trigger.seq >= start and (not fresh or trigger.seq > fresh[-1].seq):
                fresh.append(trigger)
            if trigger.seq >= last:
                done.set()

        sub = await js.subscribe(
            self.subjects,
            stream=self.stream,
            cb=deliver,
            ordered_consumer=True,
            config=ConsumerConfig(
                deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start
            ),
        )
        try:
            await asyncio.wait_for(done.wait(), timeout)
        except TimeoutError:
            raise TimeoutError(
                f"read {len(fresh)} of the trigger stream's messages {start}..{last} "
                f"in {timeout:g} s"
            ) from None
        finally:
            with contextlib.suppress(nats.errors.Error):
                await sub.unsubscribe()
        for trigger in fresh:
            if trigger.seq > last:
                break
            self.triggers.append(trigger)
            if trigger.scheduled and trigger.due_ms > self._newest.get(trigger.job, 0):
                self._newest[trigger.job] = trigger.due_ms
        return self.triggers

    def of(self, job: str, *, scheduled_only: bool = True) -> list[Trigger]:
        """``job``'s triggers in stream order (scheduled ticks only unless told otherwise)."""
        return [t for t in self.triggers if t.job == job and (t.scheduled or not scheduled_only)]

    def by_node(self, node: str) -> list[Trigger]:
        return [t for t in self.triggers if t.node == node]

    def newest_due(self, job: str) -> int | None:
        """The latest due among ``job``'s scheduled triggers read so far."""
        return self._newest.get(job)

    async def wait_covered(
        self, jobs: Iterable[JobSpec], until_ms: float, timeout: float = 30.0
    ) -> list[Trigger]:
        """Read until every job has a trigger for a tick due at or after ``until_ms``: since
        a job's ticks are published in due order, every earlier tick is then settled."""
        names = [job.name for job in jobs]

        async def covered() -> bool:
            await self.read(timeout=10)
            return all((self.newest_due(name) or 0) >= until_ms for name in names)

        await wait_for_async(
            covered,
            timeout=timeout,
            interval=0.2,
            message=f"triggers of {len(names)} jobs reaching due {until_ms:.0f}",
            # A fault the test injected can make the stream briefly unreachable.
            ignore=(TimeoutError, nats.errors.Error),
        )
        return self.triggers

    def check_exactly_once(
        self,
        jobs: Iterable[JobSpec],
        window: tuple[float, float],
        *,
        early_tolerance_ms: float = 50.0,
    ) -> list[Violation]:
        """:func:`find_violations` over what has been read so far; call :meth:`read` first."""
        return find_violations(self.triggers, jobs, window, early_tolerance_ms=early_tolerance_ms)


# --- replica processes ----------------------------------------------------------------------

_STARTED = r"replica {node} started"
_FAILPOINT = r"failpoint {name} \S+ job={job}"
_STOPPED_AT_FAILPOINT = r"failpoint \S+ stop job="


class ReplicaFleet:
    """``count`` hrwcron replicas, node ids ``<prefix>0``.., as separate processes.

    Each replica gets ``HRWCRON_NATS_URL``, its ``HRWCRON_NODE_ID``, no HTTP listener, info
    logging, the fleet's ``timings`` (:data:`harness.timings.QUICK` unless given), the fleet's
    ``env`` (which may override them) and then any per-replica ``extra_env`` given to :meth:`start`
    (a failpoint, a faked clock, a proxy URL). Logs go to ``log_dir/<node>.log`` and survive
    restarts, so a failing test can print the whole history with :meth:`dump_logs`.

    Faults take the replica's index: ``kill`` (SIGKILL, the crash), ``pause``/``resume``
    (SIGSTOP/SIGCONT, a long GC pause or a frozen VM), ``terminate`` (SIGTERM, a graceful stop),
    ``restart``. The blocking waits poll with a deadline; they may be called from async tests.
    """

    def __init__(
        self,
        nats_url: str,
        count: int,
        log_dir: str | os.PathLike[str],
        *,
        env: Mapping[str, str] | None = None,
        prefix: str = "r",
        args: Sequence[str] = ("run",),
        module: str | None = "hrwcron",
        timings: Timings = QUICK,
    ) -> None:
        self.nats_url = nats_url
        self.timings = timings
        # None runs ``python <args>``: a wrapper script such as the ack journal's.
        self.module = module
        self.log_dir = Path(log_dir)
        self.env = dict(env or {})
        self.args = list(args)
        self.nodes = [f"{prefix}{i}" for i in range(count)]
        self.procs: list[ReplicaProcess | None] = [None] * count
        self._extra: list[dict[str, str]] = [{} for _ in range(count)]

    def shared_env(self) -> dict[str, str]:
        """What every replica gets: the fleet's settings without identity or faults."""
        env = {
            "HRWCRON_NATS_URL": self.nats_url,
            "HRWCRON_HTTP_LISTEN": "",
            "HRWCRON_LOG_LEVEL": "info",
        }
        env.update(self.timings.env())
        env.update(self.env)
        return env

    def replica_env(self, i: int) -> dict[str, str]:
        env = self.shared_env()
        env["HRWCRON_NODE_ID"] = self.nodes[i]
        env.update(self._extra[i])
        return env

    def config(self) -> Config:
        """The replicas' shared configuration, for the test's own ``open_stores`` (same
        buckets, stream, replication and duplicate window as the replicas)."""
        return load_config(None, self.shared_env())

    def proc(self, i: int) -> ReplicaProcess:
        proc = self.procs[i]
        if proc is None:
            raise RuntimeError(f"replica {self.nodes[i]} was never started")
        return proc

    def start(
        self, i: int, extra_env: Mapping[str, str] | None = None, *, wait: bool = True
    ) -> ReplicaProcess:
        """Start replica ``i`` (again); ``extra_env`` replaces the previous extras."""
        if extra_env is not None:
            self._extra[i] = dict(extra_env)
        old = self.procs[i]
        if old is not None and old.running:
            raise RuntimeError(f"replica {self.nodes[i]} is already running")
        env = {k: v for k, v in os.environ.items() if k not in HARNESS_ENV}
        env.update(self.replica_env(i))
        proc = ReplicaProcess(
            self.args,
            env,
            self.log_dir / f"{self.nodes[i]}.log",
            module=self.module,
            inherit_env=False,
            start=False,
        )
        self.procs[i] = proc
        proc.start()
        if wait:
            self.wait_started(i)
        return proc

    def start_all(self, timeout: float = 60.0) -> None:
        """Start every replica at once, then wait until each has joined."""
        for i in range(len(self.nodes)):
            self.start(i, wait=False)
        for i in range(len(self.nodes)):
            self.wait_started(i, timeout)

    def wait_started(self, i: int, timeout: float = 60.0) -> None:
        # A replica armed to stop itself at a failpoint may reach it before it logs "started":
        # it claims ticks once ready, while its admin API is still being set up.
        started = _STARTED.format(node=re.escape(self.nodes[i]))
        self.proc(i).wait_for_log(f"{started}|{_STOPPED_AT_FAILPOINT}", timeout)

    def running(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.running]

    def kill(self, i: int) -> None:
        self.proc(i).kill()

    def pause(self, i: int) -> None:
        self.proc(i).pause()

    def resume(self, i: int) -> None:
        self.proc(i).resume()

    def terminate(self, i: int, timeout: float = 10.0) -> int:
        return self.proc(i).terminate(timeout).returncode

    def restart(self, i: int, extra_env: Mapping[str, str] | None = None) -> ReplicaProcess:
        if self.proc(i).running:
            self.kill(i)
        return self.start(i, extra_env)

    def stopped_by_signal(self, i: int) -> bool:
        """True once the kernel reports the process stopped (after a SIGSTOP or a failpoint)."""
        try:
            stat = Path(f"/proc/{self.proc(i).pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] == "T"

    def wait_failpoint(self, i: int, name: str, job: str = r"\S+", timeout: float = 30.0) -> str:
        """Wait until replica ``i`` reports passing failpoint ``name``; returns the job."""
        match = self.proc(i).wait_for_log(
            _FAILPOINT.format(name=re.escape(name), job=f"(?P<job>{job})"), timeout
        )
        return match.group("job")

    def output(self, i: int) -> str:
        return self.proc(i).output()

    def dump_logs(self, lines: int = 80) -> str:
        """The tail of every replica's log, for a failure message."""
        parts = []
        for node in self.nodes:
            path = self.log_dir / f"{node}.log"
            with contextlib.suppress(FileNotFoundError):
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"----- {node} -----\n" + "\n".join(text))
        return "\n".join(parts)

    def stop_all(self) -> None:
        """Kill whatever still runs (a paused replica included): tear-down, not a scenario."""
        for proc in self.procs:
            if proc is not None and proc.running:
                proc.kill()

    def __enter__(self) -> ReplicaFleet:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop_all()

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)


def describe(violations: Sequence[Violation], limit: int = 30) -> str:
    """A readable list for an assertion message."""
    shown = "\n".join(map(str, violations[:limit]))
    more = len(violations) - limit
    return shown + (f"\n... and {more} more" if more > 0 else "")


def summary(triggers: Sequence[Trigger]) -> str:
    """Per node: how many triggers it published; a quick look at who did the work."""
    counts: dict[str, int] = defaultdict(int)
    for trigger in triggers:
        counts[trigger.node] += 1
    return json.dumps(dict(sorted(counts.items())))
