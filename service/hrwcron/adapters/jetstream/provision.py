"""Create or verify the buckets and the trigger stream, idempotently.

Existing resources are never altered: a setting that contradicts what hrwcron needs is reported
with what to change, because silently editing a shared stream is an operator's decision.
Replicas create everything at start-up, the worker SDK's idempotency bucket included, so that
no worker ever needs to create a bucket; ``hrwcron provision`` also holds every resource's
replicas and storage to the configuration (a bucket created with one replica on a cluster is
reported)."""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import NotFoundError

from hrwcron.adapters.jetstream.jobs import mark_lanes
from hrwcron.core import resources
from hrwcron.core.config import SchedulerConfig
from hrwcron.core.errors import StreamConfigError

_SHIPPED = SchedulerConfig()


@dataclass(frozen=True)
class Layout:
    """Names and sizes of everything hrwcron keeps in JetStream."""

    members_bucket: str = resources.MEMBERS_BUCKET
    claims_bucket: str = resources.CLAIMS_BUCKET
    jobs_bucket: str = resources.JOBS_BUCKET
    runs_bucket: str = resources.RUNS_BUCKET
    counts_bucket: str = resources.COUNTS_BUCKET
    processed_bucket: str = resources.PROCESSED_BUCKET  # the worker SDK's default
    stream: str = resources.TRIGGER_STREAM
    subject_prefix: str = resources.SUBJECT_PREFIX
    member_ttl: float = _SHIPPED.member_ttl
    run_marker_ttl: float = resources.RUN_MARKER_TTL
    duplicate_window: float = _SHIPPED.duplicate_window
    stream_max_age: float = _SHIPPED.stream_max_age
    replicas: int = 1
    storage: str = "file"
    claims_storage: str = "memory"

    @property
    def storage_type(self) -> StorageType:
        return StorageType.MEMORY if self.storage == "memory" else StorageType.FILE

    @property
    def claims_storage_type(self) -> StorageType:
        """Memory unless both settings say file: a claim lost with a server's memory can only
        make a second replica claim the tick again, and its publish then meets the stream's
        Msg-Id deduplication and subject-sequence fencing."""
        if self.storage == "memory" or self.claims_storage == "memory":
            return StorageType.MEMORY
        return StorageType.FILE


@dataclass(frozen=True)
class Shape:
    """What hrwcron creates for one bucket or stream, and what an existing one is held to:
    ``max_age`` is the age limit it is created with, a contract only when ``age_checked``."""

    label: str
    stream: str
    subjects: tuple[str, ...]
    storage: StorageType
    max_age: float | None
    age_checked: bool
    per_message_ttl: bool
    history: int = 1


def shapes(layout: Layout) -> list[Shape]:
    """Every bucket and the trigger stream, in provisioning order."""

    def bucket(
        name: str,
        storage: StorageType,
        max_age: float | None,
        *,
        age_checked: bool = True,
        per_message_ttl: bool = True,
        history: int = 1,
    ) -> Shape:
        return Shape(
            f"bucket {name}",
            f"KV_{name}",
            (f"$KV.{name}.>",),
            storage,
            max_age,
            age_checked,
            per_message_ttl,
            history,
        )

    memory = StorageType.MEMORY
    return [
        bucket(layout.members_bucket, memory, layout.member_ttl, per_message_ttl=False),
        bucket(layout.claims_bucket, layout.claims_storage_type, None),
        bucket(layout.jobs_bucket, layout.storage_type, None, history=5),
        bucket(layout.runs_bucket, memory, layout.run_marker_ttl, per_message_ttl=False),
        # Run counts of max_runs jobs must outlive the trigger stream's max_age: no TTL.
        bucket(layout.counts_bucket, layout.storage_type, None),
        # The workers' records, kept as long as the stream keeps a trigger: the age limit
        # bounds the bucket's size, it is no contract.
        bucket(
            layout.processed_bucket,
            layout.storage_type,
            layout.stream_max_age,
            age_checked=False,
        ),
        # Its age limit and duplicate window are checked against the jobs' lateness.
        Shape(
            f"stream {layout.stream}",
            layout.stream,
            (f"{layout.subject_prefix}.>",),
            layout.storage_type,
            layout.stream_max_age,
            age_checked=False,
            per_message_ttl=False,
        ),
    ]


async def provision(
    js: JetStreamContext,
    layout: Layout,
    longest_lateness: float = 60.0,
    *,
    for_workers: bool = False,
) -> None:
    """Make sure every bucket and the stream exist and fit; raises StreamConfigError otherwise.

    A missing one is created. An existing one is held to what would have been created: its
    subjects, retention and TTL, and no republish rule, source, mirror or subject transform
    (any of which would let the server write into hrwcron's buckets, or take writes meant for
    them elsewhere). ``for_workers`` (``hrwcron provision``) also holds every resource's
    replicas and storage to the layout."""
    problems: list[str] = []
    for shape in shapes(layout):
        try:
            info = await js.stream_info(shape.stream)
        except NotFoundError:
            await _create(js, layout, shape)
            if shape.stream == f"KV_{layout.jobs_bucket}":
                await mark_lanes(js, layout.jobs_bucket)  # a new bucket has lanes from the start
            continue
        if shape.stream == f"KV_{layout.jobs_bucket}" and not info.state.messages:
            await mark_lanes(js, layout.jobs_bucket)  # empty (say, purged): nothing to move
        problems += _tampered(shape, info.config)
        if shape.stream == layout.stream:
            problems += _stream_limits(shape, info.config, longest_lateness)
        if for_workers:
            problems += _placement(shape, info.config, layout.replicas)
    if problems:
        raise StreamConfigError("; ".join(problems))


async def _create(js: JetStreamContext, layout: Layout, shape: Shape) -> None:
    if shape.stream == layout.stream:
        await js.add_stream(
            StreamConfig(
                name=layout.stream,
                subjects=list(shape.subjects),
                retention=RetentionPolicy.LIMITS,
                storage=shape.storage,
                max_age=shape.max_age,
                duplicate_window=layout.duplicate_window,
                num_replicas=layout.replicas,
                discard=DiscardPolicy.OLD,
                allow_direct=True,
            )
        )
        return
    await js.create_key_value(
        config=KeyValueConfig(
            bucket=shape.stream.removeprefix("KV_"),
            history=shape.history,
            ttl=shape.max_age,
            storage=shape.storage,
            replicas=layout.replicas,
        )
    )


def _tampered(shape: Shape, config: StreamConfig) -> list[str]:
    """What makes an existing resource different from what hrwcron would have created, each
    with the fix. Replicas refuse to start on any of these."""
    where = shape.label
    fix = "delete it while nothing uses it and let hrwcron recreate it"
    found: list[str] = []
    if tuple(config.subjects or ()) != shape.subjects:
        found.append(
            f"{where} has subjects {config.subjects}, not {list(shape.subjects)}: edit its "
            "subjects, or set the bucket and stream names (scheduler.*_bucket, stream, "
            "subject_prefix) to match"
        )
    if config.republish is not None:
        republish = config.republish
        found.append(
            f"{where} has a republish rule ({republish.src} -> {republish.dest}): the server "
            f"would write each stored message elsewhere; {fix}"
        )
    if config.sources:
        names = [source.name for source in config.sources]
        found.append(f"{where} sources other streams {names}; {fix}")
    if config.mirror is not None:
        found.append(f"{where} mirrors stream {config.mirror.name}; {fix}")
    if config.subject_transform is not None:
        found.append(f"{where} transforms the subjects it stores; {fix}")
    if config.retention not in (None, RetentionPolicy.LIMITS):
        found.append(f"{where} uses {config.retention} retention; hrwcron needs limits ({fix})")
    if shape.age_checked and shape.max_age and abs((config.max_age or 0) - shape.max_age) > 1e-3:
        found.append(
            f"{where} has TTL {config.max_age or 0:g} s but hrwcron is configured for "
            f"{shape.max_age:g} s: change the setting to match, or {fix}"
        )
    if shape.per_message_ttl and not config.allow_msg_ttl:
        found.append(
            f"{where} does not allow per-message TTL (allow_msg_ttl): recreate it with "
            "nats-server 2.11 or newer"
        )
    return found


def _placement(shape: Shape, config: StreamConfig, replicas: int) -> list[str]:
    """Every resource as replicated as ``replicas`` says, on the storage the layout gives it:
    one replica on a cluster makes a NATS node's outage an outage of hrwcron (or of workers)."""
    found: list[str] = []
    have_replicas = config.num_replicas or 1
    if have_replicas != replicas:
        found.append(
            f"{shape.label} has {have_replicas} replica(s), scheduler.replicas is {replicas}: "
            "recreate it with the right count (delete it while nothing uses it, then run "
            "hrwcron provision), or change scheduler.replicas"
        )
    # nats-py gives the stored value back as a plain string.
    have = str(getattr(config.storage, "value", config.storage or "file"))
    if have != shape.storage.value:
        found.append(
            f"{shape.label} has {have} storage where hrwcron uses {shape.storage.value} "
            "(scheduler.storage; scheduler.claims_storage for claims; always memory for "
            "members and run markers): recreate it"
        )
    return found


def _stream_limits(shape: Shape, config: StreamConfig, longest_lateness: float) -> list[str]:
    where = shape.label
    found: list[str] = []
    window = config.duplicate_window or 0
    if window < longest_lateness:
        found.append(
            f"{where} has duplicate_window {window:g} s, shorter than the longest job "
            f"max_lateness {longest_lateness:g} s: raise it to at least {longest_lateness:g} s"
        )
    if (config.max_age or 0) and (config.max_age or 0) < window:
        found.append(
            f"{where} has max_age {config.max_age:g} s, shorter than its duplicate_window "
            f"{window:g} s: raise max_age"
        )
    return found
