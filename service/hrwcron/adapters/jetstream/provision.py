"""Create or verify the buckets and the trigger stream, idempotently.

Existing resources are never altered: a setting that contradicts what hrwcron needs is reported
with what to change, because silently editing a shared stream is an operator's decision.
``hrwcron provision`` also creates the worker SDK's idempotency bucket and holds every
resource's replicas and storage to the configuration (a bucket a worker created with one
replica on a cluster is reported); replicas at start-up only create what they use."""

from __future__ import annotations

from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamInfo,
)
from nats.js.errors import NotFoundError

from hrwcron.core.errors import StreamConfigError


@dataclass(frozen=True)
class Layout:
    """Names and sizes of everything hrwcron keeps in JetStream."""

    members_bucket: str = "hrwcron_members"
    claims_bucket: str = "hrwcron_claims"
    jobs_bucket: str = "hrwcron_jobs"
    runs_bucket: str = "hrwcron_runs"
    counts_bucket: str = "hrwcron_counts"
    processed_bucket: str = "hrwcron_processed"  # the worker SDK's default
    stream: str = "HRWCRON_TRIGGERS"
    subject_prefix: str = "hrwcron.trigger"
    member_ttl: float = 3.0
    run_marker_ttl: float = 30.0
    duplicate_window: float = 600.0
    stream_max_age: float = 86_400.0
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


async def provision(
    js: JetStreamContext,
    layout: Layout,
    longest_lateness: float = 60.0,
    *,
    for_workers: bool = False,
) -> None:
    """Make sure every bucket and the stream exist and fit; raises StreamConfigError otherwise.

    ``for_workers`` adds the worker SDK's processed bucket (kept as long as the stream keeps a
    trigger) and reports any resource whose replicas or storage differ from the layout."""
    problems: list[str] = []
    await _bucket(
        js,
        layout,
        layout.members_bucket,
        StorageType.MEMORY,
        history=1,
        ttl=layout.member_ttl,
        problems=problems,
    )
    await _bucket(js, layout, layout.claims_bucket, layout.claims_storage_type, 1, None, problems)
    await _bucket(js, layout, layout.jobs_bucket, layout.storage_type, 5, None, problems)
    await _bucket(
        js, layout, layout.runs_bucket, StorageType.MEMORY, 1, layout.run_marker_ttl, problems
    )
    # Run counts of max_runs jobs must outlive the trigger stream's max_age: no TTL.
    await _bucket(js, layout, layout.counts_bucket, layout.storage_type, 1, None, problems)
    if for_workers:
        await _bucket(
            js,
            layout,
            layout.processed_bucket,
            layout.storage_type,
            1,
            layout.stream_max_age,
            problems,
            check_ttl=False,  # the bucket's age limit is a bound on its size, not a contract
        )
    await _stream(js, layout, longest_lateness, problems)
    if for_workers:
        await _placement(js, layout, problems)
    if problems:
        raise StreamConfigError("; ".join(problems))


async def _bucket(
    js: JetStreamContext,
    layout: Layout,
    name: str,
    storage: StorageType,
    history: int,
    ttl: float | None,
    problems: list[str],
    *,
    check_ttl: bool = True,
) -> None:
    try:
        info = await js.stream_info(f"KV_{name}")
    except NotFoundError:
        await js.create_key_value(
            config=KeyValueConfig(
                bucket=name,
                history=history,
                ttl=ttl,
                storage=storage,
                replicas=layout.replicas,
            )
        )
        return
    config = info.config
    if check_ttl and ttl and abs((config.max_age or 0) - ttl) > 0.001:
        problems.append(
            f"bucket {name} has TTL {config.max_age or 0:g} s but hrwcron is configured for "
            f"{ttl:g} s: change member_ttl to match, or delete the bucket so it is recreated"
        )
    if name != layout.members_bucket and name != layout.runs_bucket and not config.allow_msg_ttl:
        problems.append(
            f"bucket {name} does not allow per-message TTL (allow_msg_ttl): recreate it with "
            f"nats-server 2.11 or newer"
        )


async def _placement(js: JetStreamContext, layout: Layout, problems: list[str]) -> None:
    """Every resource as replicated as ``replicas`` says, on the storage the layout gives it:
    one replica on a cluster makes a NATS node's outage an outage of hrwcron (or of workers)."""
    wanted = [
        (f"bucket {layout.members_bucket}", f"KV_{layout.members_bucket}", StorageType.MEMORY),
        (
            f"bucket {layout.claims_bucket}",
            f"KV_{layout.claims_bucket}",
            layout.claims_storage_type,
        ),
        (f"bucket {layout.jobs_bucket}", f"KV_{layout.jobs_bucket}", layout.storage_type),
        (f"bucket {layout.runs_bucket}", f"KV_{layout.runs_bucket}", StorageType.MEMORY),
        (f"bucket {layout.processed_bucket}", f"KV_{layout.processed_bucket}", layout.storage_type),
        (f"stream {layout.stream}", layout.stream, layout.storage_type),
    ]
    for label, name, storage in wanted:
        try:
            config = (await js.stream_info(name)).config
        except NotFoundError:
            continue  # reported, or created, by the checks above
        replicas = config.num_replicas or 1
        if replicas != layout.replicas:
            problems.append(
                f"{label} has {replicas} replica(s), scheduler.replicas is {layout.replicas}: "
                "recreate it with the right count (delete it while nothing uses it, then run "
                "hrwcron provision), or change scheduler.replicas"
            )
        # nats-py gives the stored value back as a plain string.
        have = str(getattr(config.storage, "value", config.storage or "file"))
        if have != storage.value:
            problems.append(
                f"{label} has {have} storage where hrwcron uses {storage.value} "
                "(scheduler.storage; scheduler.claims_storage for claims; always memory for "
                "members and run markers): recreate it"
            )


async def _stream(
    js: JetStreamContext, layout: Layout, longest_lateness: float, problems: list[str]
) -> None:
    wanted = f"{layout.subject_prefix}.>"
    try:
        info: StreamInfo = await js.stream_info(layout.stream)
    except NotFoundError:
        await js.add_stream(
            StreamConfig(
                name=layout.stream,
                subjects=[wanted],
                retention=RetentionPolicy.LIMITS,
                storage=layout.storage_type,
                max_age=layout.stream_max_age,
                duplicate_window=layout.duplicate_window,
                num_replicas=layout.replicas,
                discard=DiscardPolicy.OLD,
                allow_direct=True,
            )
        )
        return
    config = info.config
    where = f"stream {layout.stream}"
    if wanted not in (config.subjects or []):
        problems.append(
            f"{where} has subjects {config.subjects}; it must capture {wanted!r} "
            f"(edit the stream's subjects or set scheduler.subject_prefix)"
        )
    window = config.duplicate_window or 0
    if window < longest_lateness:
        problems.append(
            f"{where} has duplicate_window {window:g} s, shorter than the longest job "
            f"max_lateness {longest_lateness:g} s: raise it to at least {longest_lateness:g} s"
        )
    if (config.max_age or 0) and (config.max_age or 0) < window:
        problems.append(
            f"{where} has max_age {config.max_age:g} s, shorter than its duplicate_window "
            f"{window:g} s: raise max_age"
        )
    if config.retention not in (None, RetentionPolicy.LIMITS):
        problems.append(f"{where} uses {config.retention} retention; hrwcron needs limits")
