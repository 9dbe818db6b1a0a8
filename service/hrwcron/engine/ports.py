"""What the engine needs from the outside world. Adapters implement these; the engine imports no
NATS, Prometheus or OpenTelemetry code, so it runs unchanged over the in-memory store."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from hrwcron.core.errors import StoreError
from hrwcron.core.model import ClaimRecord, Heartbeat, JobSpec
from hrwcron.core.outcomes import Outcome
from hrwcron.core.run_limits import RunCount
from hrwcron.engine.marks import Mark

HEADER_MSG_ID = "Nats-Msg-Id"
HEADER_JOB = "Hrwcron-Job"
HEADER_DUE = "Hrwcron-Due"
# Order of a job's triggers: the nominal due of the newest scheduled tick at or before this
# message. Manual triggers carry their predecessor's value forward so they never fence a tick.
HEADER_WATERMARK = "Hrwcron-Watermark"
HEADER_KIND = "Hrwcron-Kind"
# The run number of a job with max_runs: scheduled triggers published so far, this one
# included; manual and backfill triggers carry it forward (see core/run_limits.py).
HEADER_RUN = "Hrwcron-Run"
# CloudEvents attributes, binary mode of the NATS protocol binding (scheduler.cloudevents):
# ``ce-`` plus the attribute's name. Content-Type is not the binding's (it names
# datacontenttype ce-datacontenttype) but HTTP's, which SDKs without a NATS binding read.
HEADER_CE_SPECVERSION = "ce-specversion"
HEADER_CE_ID = "ce-id"
HEADER_CE_SOURCE = "ce-source"
HEADER_CE_TYPE = "ce-type"
HEADER_CE_TIME = "ce-time"
HEADER_CE_SUBJECT = "ce-subject"
HEADER_CE_DATACONTENTTYPE = "ce-datacontenttype"
HEADER_CONTENT_TYPE = "content-type"


class FenceConflict(StoreError):
    """The stream refused a publish because the subject's last sequence was not the expected one."""


class StoreUnavailable(StoreError):
    """The store did not answer in time; the write may or may not have been applied."""


class StoreRefused(StoreError):
    """The store refused a write for what it is (too large, a limit, a subject or header it
    cannot take); not a fence conflict. Sending the same write again cannot succeed, so for a
    trigger the tick fails, not the replica. ``err_code`` is the server's code, if any."""

    def __init__(self, message: str, err_code: int = 0) -> None:
        super().__init__(message)
        self.err_code = err_code


# One claim write of a batch: (key, record, ttl in seconds).
ClaimWrite = tuple[str, ClaimRecord, float]
# One trigger of a batch: (subject, body, headers, expected last subject sequence). The
# headers dict is the adapter's to extend; the caller does not use it afterwards.
TriggerWrite = tuple[str, bytes, dict[str, str], int]


@dataclass(frozen=True, slots=True)
class MemberRecord:
    heartbeat: Heartbeat
    revision: int


@dataclass(frozen=True, slots=True)
class ServerTime:
    """One clock sample: a server timestamp bracketed by local wall-clock readings (ms)."""

    sent_ms: float
    server_ms: float
    received_ms: float


@dataclass(frozen=True, slots=True)
class Published:
    seq: int
    duplicate: bool


@dataclass(frozen=True, slots=True)
class LastTrigger:
    """The newest trigger on a subject: its stream sequence, Msg-Id, watermark (due ms) and
    run number (0 unless the job has max_runs)."""

    seq: int
    msg_id: str
    watermark: int
    run: int = 0


@dataclass(frozen=True, slots=True)
class TriggerRecord:
    """One stored trigger as the admin API reports it; ``body`` is empty for headers-only reads."""

    seq: int
    subject: str
    msg_id: str
    stored_ms: float
    headers: Mapping[str, str]
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class JobEvent:
    """A job appeared or changed (``spec`` set), was deleted (``spec`` None), or could not be
    decoded (``error`` set). ``name`` is the job's name, ``key`` the store key it came from."""

    name: str
    spec: JobSpec | None
    revision: int
    error: str = ""
    written_ms: float = 0.0  # server time of this revision; 0 when unknown
    key: str = ""  # the bucket key it came from (core/partitions.py); empty: the name


@dataclass(frozen=True, slots=True)
class Covered:
    """From a jobs watch: every change up to ``revision`` of the jobs it watches has been
    delivered (a watch over some lanes sees the bucket move in others, so the revision of its
    last event says nothing of that)."""

    revision: int


class MembersPort(Protocol):
    async def register(self, node: str, heartbeat: Heartbeat, wait: float) -> int: ...
    async def beat(self, node: str, heartbeat: Heartbeat, last_revision: int) -> int: ...
    async def deregister(self, node: str) -> None: ...
    async def snapshot(self) -> dict[str, MemberRecord]: ...
    def watch(self) -> AsyncIterator[tuple[str, MemberRecord | None]]: ...
    async def stored_at(self, revision: int) -> float | None:
        """The server's timestamp (epoch ms) of the member write with this revision."""
        ...


class ClaimsPort(Protocol):
    async def create(self, key: str, record: ClaimRecord, ttl: float) -> int | None: ...
    async def create_many(self, writes: Sequence[ClaimWrite]) -> list[asyncio.Future[int | None]]:
        """Create-only writes sent together; one future per write, in order: the new revision,
        None when the key holds a value, or the error of that write alone (StoreUnavailable
        when its outcome is unknown)."""
        ...

    async def get(self, key: str) -> tuple[ClaimRecord, int] | None: ...
    async def replace(
        self, key: str, record: ClaimRecord, last_revision: int, ttl: float
    ) -> int | None: ...
    async def release(self, key: str, last_revision: int) -> bool:
        """Delete the claim if it is still at ``last_revision`` (a trigger that was not
        published gives its claim back, so a retry can take it)."""
        ...


class TriggersPort(Protocol):
    async def publish(
        self,
        subject: str,
        body: bytes,
        headers: Mapping[str, str],
        expected_last_seq: int,
    ) -> Published: ...
    async def publish_many(self, writes: Sequence[TriggerWrite]) -> list[asyncio.Future[Published]]:
        """Fenced publishes sent together; one future per trigger, in order, failing with
        FenceConflict, StoreRefused or StoreUnavailable for that trigger alone."""
        ...

    async def last(self, subject: str) -> LastTrigger | None: ...
    async def last_many(self, subjects: Sequence[str]) -> dict[str, LastTrigger]:
        """The newest trigger of each subject that has one, in one round."""

    def follow(self) -> AsyncIterator[tuple[str, LastTrigger] | None]: ...
    async def history(self, subject: str, limit: int, before_seq: int = 0) -> list[TriggerRecord]:
        """The newest ``limit`` triggers of ``subject``, oldest first; with ``before_seq``,
        the newest of those stored before that stream sequence."""
        ...

    async def since(self, subject: str, since_ms: float, limit: int) -> list[TriggerRecord]:
        """Headers of the triggers of ``subject`` stored at or after ``since_ms`` (server time),
        oldest first, at most ``limit`` of them."""
        ...


class JobsEditor(Protocol):
    """Reading and writing job specs: what applying a job file needs, also over the admin API."""

    async def snapshot(self) -> dict[str, JobEvent]: ...
    async def get(self, name: str) -> JobEvent | None: ...
    async def put(self, spec: JobSpec, last_revision: int | None) -> int: ...
    async def delete(self, name: str, last_revision: int | None) -> None: ...


class JobsPort(JobsEditor, Protocol):
    def watch(
        self, lanes: Collection[str] | None = None
    ) -> AsyncIterator[JobEvent | Covered | None]:
        """Every job's newest state, then None, then every change, and from time to time how
        far it has delivered everything (:class:`Covered`). With ``lanes``
        (core/partitions.py) the store may leave out the jobs of other lanes; the caller
        keeps only what it holds either way."""
        ...

    async def put_many(self, items: Sequence[tuple[JobSpec, int | None]]) -> list[int | Exception]:
        """``put`` of every ``(spec, last_revision)``, as fast as the store allows; per item
        the new revision or the error ``put`` would have raised."""
        ...

    async def delete_many(self, items: Sequence[tuple[str, int | None]]) -> list[Exception | None]:
        """``delete`` of every ``(name, last_revision)``; per item None or the error."""
        ...

    async def last_revision(self) -> int:
        """The newest revision written to the bucket, deletions included (0 when empty)."""
        ...

    def nudge(self) -> None:
        """Have every watch say how far it has got (:class:`Covered`) as soon as it can."""
        ...


class MarksPort(Protocol):
    """Progress marks between replicas: announced often, never stored (see marks.py)."""

    async def announce(self, mark: Mark) -> None: ...
    def follow(self) -> AsyncIterator[Mark]:
        """Every mark announced from now on, this replica's own included."""


class RunsPort(Protocol):
    """Run markers written by workers, read for ``overlap = "skip"``."""

    async def running(self, job: str) -> bool: ...


class CountsPort(Protocol):
    """The durable copy of each max_runs job's run count (see core/run_limits.py)."""

    async def get(self, job: str) -> RunCount | None: ...
    async def raise_total(self, job: str, total: int) -> RunCount:
        """Make the stored total at least ``total`` (compare-and-set); returns what is stored."""
        ...

    async def reset(self, job: str, total: int) -> RunCount:
        """Start the count again: base and total become the larger of ``total`` and the
        stored total; returns what is stored."""
        ...


class TickSpan(Protocol):
    """The trace of one tick decision; children for claim and publish."""

    def set(self, key: str, value: str | int | float | bool) -> None: ...
    def start_child(
        self, name: str, attributes: Mapping[str, str | int | float | bool]
    ) -> TickSpan:
        """A child started now and ended by :meth:`end`: a batch interleaves many ticks, so
        their spans cannot nest as context managers do."""
        ...

    def end(self) -> None: ...
    def inject(self, headers: dict[str, str]) -> None: ...


class Observer(Protocol):
    """Where the engine reports decisions: metrics, logs and traces live behind this."""

    # False: the engine makes no span objects at all.
    tracing: bool

    def start_tick_span(self, job: str, tick_key: str, due_ms: int, rank: int) -> TickSpan:
        """A tick's root span, started now and ended by its ``end``."""
        ...

    def claim_ops(self, creates: int, reads: int, replaces: int) -> None:
        """Claim-bucket operations since the last report."""
        ...

    def outcome(
        self,
        job: str,
        outcome: Outcome,
        *,
        due_ms: int,
        rank: int,
        attempt: int,
        lateness_ms: float | None,
    ) -> None: ...
    def membership(self, live: list[str], changed_owners: int) -> None: ...
    def readiness(self, ready: bool, reason: str) -> None: ...
    def heartbeat(self, ok: bool, offset_ms: float, age_s: float) -> None: ...
    def bad_job(self, name: str, error: str) -> None: ...
    def trigger_seen(self, subject: str, last: LastTrigger) -> None: ...
    def digest_mismatch(self, mismatched: list[str]) -> None: ...
    def owned(self, count: int) -> None: ...
    def owner_changed(self, job: str, previous: str | None, owner: str | None) -> None: ...


class NullSpan:
    """A span that records nothing: tracing off costs one method call."""

    def set(self, key: str, value: str | int | float | bool) -> None:
        return None

    def start_child(
        self, name: str, attributes: Mapping[str, str | int | float | bool]
    ) -> TickSpan:
        return self

    def end(self) -> None:
        return None

    def inject(self, headers: dict[str, str]) -> None:
        return None


class NullObserver:
    """Observes nothing; the base for observers that care about a few events only."""

    _span = NullSpan()
    tracing = False

    def start_tick_span(self, job: str, tick_key: str, due_ms: int, rank: int) -> TickSpan:
        return self._span

    def claim_ops(self, creates: int, reads: int, replaces: int) -> None:
        return None

    def outcome(
        self,
        job: str,
        outcome: Outcome,
        *,
        due_ms: int,
        rank: int,
        attempt: int,
        lateness_ms: float | None,
    ) -> None:
        return None

    def membership(self, live: list[str], changed_owners: int) -> None:
        return None

    def readiness(self, ready: bool, reason: str) -> None:
        return None

    def heartbeat(self, ok: bool, offset_ms: float, age_s: float) -> None:
        return None

    def bad_job(self, name: str, error: str) -> None:
        return None

    def trigger_seen(self, subject: str, last: LastTrigger) -> None:
        return None

    def digest_mismatch(self, mismatched: list[str]) -> None:
        return None

    def owned(self, count: int) -> None:
        return None

    def owner_changed(self, job: str, previous: str | None, owner: str | None) -> None:
        return None
