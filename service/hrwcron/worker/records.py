"""The worker's two KV records: :class:`Processed` (each tick key run once, by compare-and-set)
and :class:`RunMarker` (what the scheduler reads to skip ticks of ``overlap = "skip"`` jobs)."""

from __future__ import annotations

import hashlib
import logging
import re
import time
from collections.abc import Callable

import msgspec
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    KeyValueConfig,
    StorageType,
    StreamInfo,
)
from nats.js.errors import (
    APIError,
    KeyWrongLastSequenceError,
    NotFoundError,
    ServiceUnavailableError,
)
from nats.js.kv import KeyValue

from hrwcron.adapters.jetstream.kv import conditional_put, last_message
from hrwcron.adapters.jetstream.pipeline import WRONG_LAST_SEQUENCE
from hrwcron.core import resources
from hrwcron.core.errors import HrwcronError
from hrwcron.core.model import job_name_problem
from hrwcron.core.ticks import CLAIM_DUE, CLAIM_MANUAL, claim_key
from hrwcron.worker.errors import WorkerSetupError

log = logging.getLogger("hrwcron.worker")

DEFAULT_RUNS_BUCKET = resources.RUNS_BUCKET
DEFAULT_PROCESSED_BUCKET = resources.PROCESSED_BUCKET
RUN_MARKER_TTL = resources.RUN_MARKER_TTL  # the runs bucket's TTL, as replicas provision it
DEFAULT_PROCESSED_TTL = 86_400.0  # when the trigger stream keeps messages forever


def _legacy_kv_key(tick: str) -> str:
    # The key earlier versions wrote: colons made dots, which let ``sec:manual:<T>`` (a manual
    # trigger of job ``sec``) and ``sec.manual:<T>`` (a tick of job ``sec.manual``) share one.
    return tick.replace(":", ".")


def tick_record_key(tick: str) -> str:
    """The processed key of a tick key, as the claims bucket keys ticks: ``<job>.due.<ms>``
    for ``<job>:<ms>``, ``<job>.manual.<id>`` for ``<job>:manual:<id>``. A job name holds no
    colon and the last two tokens are always kind and value, so no two ticks share a key,
    whatever the job names and trigger ids. A tick key of neither shape (not one a replica
    publishes) gets a key of its own under ``other``."""
    parts = tick.split(":")
    job_ok = bool(parts) and job_name_problem(parts[0]) is None
    if job_ok and len(parts) == 2 and _DIGITS.fullmatch(parts[1]):
        return claim_key(parts[0], CLAIM_DUE, parts[1])
    if job_ok and len(parts) == 3 and parts[1] == CLAIM_MANUAL and _TOKEN.fullmatch(parts[2]):
        return claim_key(parts[0], CLAIM_MANUAL, parts[2])
    return f"other.{hashlib.sha256(tick.encode()).hexdigest()[:32]}"


_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_DIGITS = re.compile(r"[0-9]{1,19}")


def now_ms() -> int:
    return int(time.time() * 1000)


def _stale_revision(exc: Exception) -> bool:
    return isinstance(exc, KeyWrongLastSequenceError) or (
        isinstance(exc, APIError) and exc.err_code in WRONG_LAST_SEQUENCE
    )


async def _ensure_bucket(js: JetStreamContext, config: KeyValueConfig) -> StreamInfo:
    """The bucket's stream, created from ``config`` if missing. An existing bucket is used as
    it is; fewer replicas than asked for is logged, since ``hrwcron provision`` reports it."""
    stream = f"KV_{config.bucket}"
    try:
        info = await js.stream_info(stream)
    except NotFoundError:
        try:
            await js.create_key_value(config=config)
        except (NoRespondersError, ServiceUnavailableError, NatsTimeoutError) as exc:
            # With the shipped accounts workers cannot create buckets (a bucket's republish
            # rule would write inside the scheduler's account): the replicas create it.
            raise WorkerSetupError(
                f"bucket {config.bucket} does not exist, and this connection may not create "
                f"it ({type(exc).__name__}): start an hrwcron replica or run `hrwcron "
                "provision` first"
            ) from None
        return await js.stream_info(stream)
    have = info.config.num_replicas or 1
    if have < config.replicas:
        log.warning(
            "bucket %s has %d replica(s), fewer than the %d of the trigger stream: one NATS "
            "node down makes it unavailable; recreate it (hrwcron provision creates it right)",
            config.bucket,
            have,
            config.replicas,
        )
    return info


# --------------------------------------------------------------------------- processed ticks

RUN = "run"
DONE = "done"
BUSY = "busy"

RUNNING = "running"
FINISHED = "done"
RELEASED = "released"


class _Record(msgspec.Struct):
    state: str  # running | done | released
    owner: str  # the run that wrote it: ``<worker>/<run id>``
    at_ms: int


class Processed:
    """Tick keys a consumer has processed, one KV key each, written only by compare-and-set.

    ``begin`` claims ``<consumer>.<tick>`` as *running* (create-only; a delete or purge marker
    left by an operator counts as absent, a *released* record is taken back), ``extend`` renews
    it while the handler runs, ``finish`` turns it into *done*, ``release`` (after a failure)
    gives the tick back so the next delivery retries. A *running* record another run holds is
    left alone while its revision keeps changing; one that stayed at the same revision for
    ``lease`` seconds, as the caller observed on its own clock, may be taken over with
    ``take_over``. Records live ``ttl`` seconds (per-key TTL; the bucket's max age too).

    Every write names the revision it replaces, so a write that timed out and lands later
    cannot undo a newer one; a run that finds its own newer record (its earlier write landed
    after all) goes on from there.

    Records written by earlier versions sit under :func:`_legacy_kv_key`. A tick published
    before ``legacy_before_ms`` (when this worker started) may have been run by one, so its
    legacy record is read once before it runs: a *done* one makes it a duplicate. Later
    ticks cannot have one, so they pay nothing and cannot be hit by its collision."""

    def __init__(
        self,
        js: JetStreamContext,
        bucket: str,
        *,
        namespace: str,
        ttl: float = DEFAULT_PROCESSED_TTL,
        lease: float = 30.0,
        legacy_before_ms: int = 0,
    ) -> None:
        self._js = js
        self.bucket = bucket
        self.namespace = namespace
        self.ttl = ttl
        self.lease = lease
        self.legacy_before_ms = legacy_before_ms

    @classmethod
    async def open(
        cls,
        js: JetStreamContext,
        *,
        namespace: str,
        bucket: str = DEFAULT_PROCESSED_BUCKET,
        ttl: float = DEFAULT_PROCESSED_TTL,
        lease: float = 30.0,
        replicas: int = 1,
        storage: StorageType = StorageType.FILE,
        max_bytes: int | None = None,
    ) -> Processed:
        """Bind to ``bucket``, creating it if missing: history 1, per-key TTL allowed, max age
        ``ttl``, ``replicas``, ``storage``, and ``max_bytes`` if given (a full bucket refuses
        new records: the worker then holds its triggers and logs, it does not run them)."""
        info = await _ensure_bucket(
            js,
            KeyValueConfig(
                bucket=bucket,
                history=1,
                ttl=ttl,
                storage=storage,
                replicas=replicas,
                max_bytes=max_bytes,
            ),
        )
        if not info.config.allow_msg_ttl:
            raise WorkerSetupError(
                f"bucket {bucket} does not allow per-message TTL (allow_msg_ttl); delete it "
                "so the worker recreates it, or name another bucket"
            )
        return cls(js, bucket, namespace=namespace, ttl=ttl, lease=lease, legacy_before_ms=now_ms())

    def key(self, tick: str) -> str:
        return f"{self.namespace}.{tick_record_key(tick)}"

    async def _legacy_done(self, tick: str) -> bool:
        _, data = await last_message(
            self._js, self.bucket, f"{self.namespace}.{_legacy_kv_key(tick)}"
        )
        if data is None:
            return False
        try:
            return msgspec.json.decode(data, type=_Record).state == FINISHED
        except msgspec.MsgspecError:
            return False

    async def _write(self, tick: str, state: str, owner: str, last: int) -> int | None:
        record = msgspec.json.encode(_Record(state, owner, now_ms()))
        return await conditional_put(self._js, self.bucket, self.key(tick), record, last, self.ttl)

    async def read(self, tick: str) -> tuple[_Record | None, int]:
        """The tick's record (None: absent, deleted or purged) and the key's last revision,
        which for a delete or purge marker is the marker's own (0 when the key has none)."""
        last, data = await last_message(self._js, self.bucket, self.key(tick))
        if data is None:
            return None, last
        try:
            return msgspec.json.decode(data, type=_Record), last
        except msgspec.MsgspecError:
            return _Record(RELEASED, "", 0), last  # unreadable: anyone may claim it, by CAS

    async def begin(
        self, tick: str, owner: str, published_ms: int | None = None
    ) -> tuple[str, int]:
        """``(RUN, revision)`` when ``owner`` should run the tick, ``(DONE, revision)`` when it
        was processed already, ``(BUSY, revision)`` while another run holds it.
        ``published_ms`` is when the trigger was stored, for the legacy record check."""
        for _ in range(5):
            revision = await self._write(tick, RUNNING, owner, 0)
            if revision is not None:
                legacy = published_ms is not None and published_ms < self.legacy_before_ms
                if legacy and await self._legacy_done(tick):
                    done = await self._rewrite(tick, FINISHED, owner, revision)
                    return DONE, done or revision
                return RUN, revision
            record, last = await self.read(tick)
            if record is None:
                if not last:
                    continue  # expired between the write and the read
                # An operator deleted or purged the record to have the tick run again.
                revision = await self._write(tick, RUNNING, owner, last)
            elif record.state == FINISHED:
                return DONE, last
            elif record.state == RUNNING:
                # Our own earlier attempt, whose reply was lost, or somebody else's run.
                return (RUN if record.owner == owner else BUSY), last
            else:  # released by a run that failed or was stopped
                revision = await self._write(tick, RUNNING, owner, last)
            if revision is not None:
                return RUN, revision
        raise HrwcronError(f"the processed record of {tick} kept changing; try again")

    async def take_over(self, tick: str, owner: str, revision: int) -> int | None:
        """Claim a *running* record still at ``revision``; None if it changed meanwhile."""
        return await self._write(tick, RUNNING, owner, revision)

    async def _rewrite(self, tick: str, state: str, owner: str, revision: int) -> int | None:
        written = await self._write(tick, state, owner, revision)
        if written is not None:
            return written
        record, last = await self.read(tick)
        if record is None or record.owner != owner:
            return None  # another run holds the tick now
        if record.state == state and state != RUNNING:
            return last  # an earlier attempt of this very write landed after its timeout
        if record.state != RUNNING:
            return None
        return await self._write(tick, state, owner, last)

    async def extend(self, tick: str, owner: str, revision: int) -> int | None:
        """Renew the running record; None if another run holds it now."""
        return await self._rewrite(tick, RUNNING, owner, revision)

    async def finish(self, tick: str, owner: str, revision: int) -> bool:
        return await self._rewrite(tick, FINISHED, owner, revision) is not None

    async def release(self, tick: str, owner: str, revision: int) -> bool:
        return await self._rewrite(tick, RELEASED, owner, revision) is not None

    async def state(self, tick: str) -> str | None:
        record, _ = await self.read(tick)
        return None if record is None else record.state


# --------------------------------------------------------------------------- run markers


class _RunEntry(msgspec.Struct):
    worker: str
    tick: str
    started_ms: int
    beat_ms: int


class _Marker(msgspec.Struct):
    # The newest run, for readers that show one; ``runs`` holds every run in progress.
    worker: str
    tick: str
    started_ms: int
    beat_ms: int
    runs: dict[str, _RunEntry] = msgspec.field(default_factory=dict)


class RunMarker:
    """``<runs bucket>/<job>`` while any run of ``job`` is in progress, on any worker.

    The marker lists every run by its id; a run adds itself, renews its entry each heartbeat
    and removes only itself, deleting the key when it was the last one. Writes are
    compare-and-set, so two workers never drop each other's entries. Entries not renewed for
    the marker TTL belong to dead runs and are dropped by the next write; the bucket's TTL
    removes the key when every run holding it died."""

    def __init__(
        self, js: JetStreamContext, kv: KeyValue, bucket: str, worker: str, ttl: float
    ) -> None:
        self._js = js
        self._kv = kv
        self.bucket = bucket
        self.worker = worker
        self.ttl = ttl
        self._known: dict[str, tuple[_Marker | None, int]] = {}

    @classmethod
    async def open(
        cls, js: JetStreamContext, worker: str, bucket: str, *, replicas: int = 1
    ) -> RunMarker:
        # The same shape the replicas provision, so whoever comes first makes it.
        info = await _ensure_bucket(
            js,
            KeyValueConfig(
                bucket=bucket,
                history=1,
                ttl=RUN_MARKER_TTL,
                storage=StorageType.MEMORY,
                replicas=replicas,
            ),
        )
        kv = await js.key_value(bucket)
        return cls(js, kv, bucket, worker, info.config.max_age or RUN_MARKER_TTL)

    async def _read(self, job: str) -> tuple[_Marker | None, int]:
        last, data = await last_message(self._js, self.bucket, job)
        if data is None:
            return None, last
        try:
            return msgspec.json.decode(data, type=_Marker), last
        except msgspec.MsgspecError:
            return None, last  # not ours to understand: replaced by the next write

    async def _update(self, job: str, change: Callable[[dict[str, _RunEntry]], bool]) -> None:
        """Apply ``change`` (True when it changed something) to the job's runs and write the
        result by compare-and-set: from the last marker this worker wrote, re-read after a
        conflict (another run's write, or the marker's expiry)."""
        for attempt in range(8):
            if attempt or job not in self._known:
                self._known[job] = await self._read(job)
            current, last = self._known[job]
            runs = dict(current.runs) if current is not None else {}
            changed = change(runs)
            horizon = now_ms() - self.ttl * 1000
            alive = {run: entry for run, entry in runs.items() if entry.beat_ms >= horizon}
            if not changed and len(alive) == len(runs):
                return
            if alive:
                newest = max(alive.values(), key=lambda entry: entry.started_ms)
                marker = _Marker(
                    newest.worker, newest.tick, newest.started_ms, newest.beat_ms, alive
                )
                written = await conditional_put(
                    self._js, self.bucket, job, msgspec.json.encode(marker), last, None
                )
                if written is not None:
                    self._known[job] = (marker, written)
                    return
            elif current is None:
                return  # nothing left and nothing stored
            else:
                try:
                    await self._kv.delete(job, last=last)
                except APIError as exc:
                    if not _stale_revision(exc):
                        raise
                else:
                    self._known.pop(job, None)
                    return
        raise HrwcronError(f"the run marker of {job} kept changing; try again")

    async def mark(self, job: str, run: str, tick: str, started_ms: int) -> None:
        """Add or renew ``run``'s entry in the marker of ``job``."""
        entry = _RunEntry(self.worker, tick, started_ms, now_ms())

        def add(runs: dict[str, _RunEntry]) -> bool:
            runs[run] = entry
            return True

        await self._update(job, add)

    async def clear(self, job: str, run: str) -> None:
        """Remove ``run``'s entry; delete the marker if no other run of ``job`` is left."""

        def remove(runs: dict[str, _RunEntry]) -> bool:
            return runs.pop(run, None) is not None

        await self._update(job, remove)
        self._known.pop(job, None)
