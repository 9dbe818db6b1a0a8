"""Create or verify the buckets and the trigger stream, idempotently.

Existing resources are never altered: a setting that contradicts what hrwcron needs is reported
with what to change, because silently editing a shared stream is an operator's decision."""

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

from ..errors import StreamConfigError


@dataclass(frozen=True)
class Layout:
    """Names and sizes of everything hrwcron keeps in JetStream."""

    members_bucket: str = "hrwcron_members"
    claims_bucket: str = "hrwcron_claims"
    jobs_bucket: str = "hrwcron_jobs"
    runs_bucket: str = "hrwcron_runs"
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


async def provision(js: JetStreamContext, layout: Layout, longest_lateness: float = 60.0) -> None:
    """Make sure every bucket and the stream exist and fit; raises StreamConfigError otherwise."""
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
    await _stream(js, layout, longest_lateness, problems)
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
    if ttl and abs((config.max_age or 0) - ttl) > 0.001:
        problems.append(
            f"bucket {name} has TTL {config.max_age or 0:g} s but hrwcron is configured for "
            f"{ttl:g} s: change member_ttl to match, or delete the bucket so it is recreated"
        )
    if name != layout.members_bucket and name != layout.runs_bucket and not config.allow_msg_ttl:
        problems.append(
            f"bucket {name} does not allow per-message TTL (allow_msg_ttl): recreate it with "
            f"nats-server 2.11 or newer"
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
