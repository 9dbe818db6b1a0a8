"""`hrwcron provision` against a real nats-server: creates once, verifies after, changes nothing
that contradicts it, and says so."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import nats
import pytest
from nats.js.api import (
    ConsumerConfig,
    KeyValueConfig,
    RePublish,
    StorageType,
    StreamConfig,
    StreamSource,
)

from harness import NatsServer, free_ports

RESOURCES = [
    "bucket hrwcron_members",
    "bucket hrwcron_claims",
    "bucket hrwcron_jobs",
    "bucket hrwcron_runs",
    "bucket hrwcron_counts",
    "bucket hrwcron_processed",
    "stream HRWCRON_TRIGGERS",
]


def provision(
    url: str, *extra: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hrwcron", "provision", *extra],
        env={"PATH": "/usr/bin:/bin", "HRWCRON_NATS_URL": url, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_creates_then_verifies(nats_server: NatsServer) -> None:
    first = await asyncio.to_thread(provision, nats_server.url)
    assert first.returncode == 0, first.stderr
    lines = first.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == RESOURCES
    assert all(": created (" in line for line in lines), lines
    assert "subjects hrwcron.trigger.>" in lines[-1]
    assert "duplicate window 10m" in lines[-1]
    # The worker SDK's idempotency bucket keeps a record as long as the stream keeps a trigger.
    assert lines[-2].endswith("(file storage, replicas 1, max age 24h)"), lines[-2]
    # Claims in memory (Msg-Id and fencing stop duplicates), jobs and triggers on disk.
    storage = {
        line.split(":")[0]: line.split(" storage")[0].rsplit(" ", 1)[-1].lstrip("(")
        for line in lines
    }
    assert storage == {
        "bucket hrwcron_members": "memory",
        "bucket hrwcron_claims": "memory",
        "bucket hrwcron_jobs": "file",
        "bucket hrwcron_runs": "memory",
        "bucket hrwcron_counts": "file",
        "bucket hrwcron_processed": "file",
        "stream HRWCRON_TRIGGERS": "file",
    }

    again = await asyncio.to_thread(provision, nats_server.url)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout.replace(": created (", ": exists (")


async def test_a_contradicting_stream_is_reported_and_left_alone(nats_server: NatsServer) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="HRWCRON_TRIGGERS", subjects=["elsewhere.>"]))
        done = await asyncio.to_thread(provision, nats_server.url)
        assert done.returncode == 1
        assert done.stdout == ""
        assert "stream HRWCRON_TRIGGERS has subjects ['elsewhere.>']" in done.stderr
        assert "hrwcron.trigger.>" in done.stderr
        info = await js.stream_info("HRWCRON_TRIGGERS")
        assert info.config.subjects == ["elsewhere.>"]
    finally:
        await nc.close()


async def test_a_worker_bucket_unlike_the_layout_is_reported_and_left_alone(
    nats_server: NatsServer,
) -> None:
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        # As a worker given processed_storage="memory" would have created it.
        await js.create_key_value(
            config=KeyValueConfig(bucket="hrwcron_processed", storage=StorageType.MEMORY)
        )
        done = await asyncio.to_thread(provision, nats_server.url)
        assert done.returncode == 1
        assert done.stdout == ""
        assert "bucket hrwcron_processed has memory storage" in done.stderr
        assert "file" in done.stderr and "scheduler.storage" in done.stderr
        info = await js.stream_info("KV_hrwcron_processed")
        assert info.config.storage == StorageType.MEMORY
    finally:
        await nc.close()


async def test_claims_on_disk_when_configured(nats_server: NatsServer) -> None:
    env = {"HRWCRON_SCHEDULER_CLAIMS_STORAGE": "file"}
    done = await asyncio.to_thread(lambda: provision(nats_server.url, env=env))
    assert done.returncode == 0, done.stderr
    assert "bucket hrwcron_claims: created (file storage" in done.stdout


def test_an_unreachable_server_fails_within_the_timeout() -> None:
    (port,) = free_ports(1)
    done = provision(f"nats://127.0.0.1:{port}", "--timeout", "1")
    assert done.returncode == 1
    assert f"not done after 1 s; is NATS reachable at nats://127.0.0.1:{port}?" in done.stderr
    assert done.stdout == ""


def test_a_bad_timeout_is_a_usage_error() -> None:
    done = provision("nats://127.0.0.1:4222", "--timeout", "0")
    assert done.returncode == 2
    assert "--timeout" in done.stderr and "above 0" in done.stderr


def _run(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hrwcron", "run"],
        env={
            "PATH": "/usr/bin:/bin",
            "HRWCRON_NATS_URL": url,
            "HRWCRON_NODE_ID": "tamper-check",
            "HRWCRON_HTTP_LISTEN": "",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("tamper", "said"),
    [
        (
            {"republish": RePublish(src=">", dest="$KV.hrwcron_jobs.>")},
            "bucket hrwcron_processed has a republish rule (> -> $KV.hrwcron_jobs.>)",
        ),
        (
            {"subjects": ["$KV.hrwcron_processed.>", "elsewhere.>"]},
            "bucket hrwcron_processed has subjects",
        ),
        ({"sources": [StreamSource(name="OTHER")]}, "bucket hrwcron_processed sources"),
    ],
)
async def test_a_tampered_bucket_is_refused_by_provision_and_by_replicas(
    nats_server: NatsServer, tamper: dict[str, object], said: str
) -> None:
    """As a worker of the old single-account layout could have made it before any replica
    ran: the bucket a role needs, with a rule that writes elsewhere."""
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        await js.add_stream(StreamConfig(name="OTHER", subjects=["other.>"]))
        fields: dict[str, object] = {
            "name": "KV_hrwcron_processed",
            "subjects": ["$KV.hrwcron_processed.>"],
            "allow_msg_ttl": True,
            **tamper,
        }
        await js.add_stream(StreamConfig(**fields))  # type: ignore[arg-type]
        for done in await asyncio.gather(
            asyncio.to_thread(provision, nats_server.url), asyncio.to_thread(_run, nats_server.url)
        ):
            assert done.returncode == 1, done.stderr
            refusals = [line for line in done.stderr.splitlines() if said in line]
            assert len(refusals) == 1, done.stderr
            assert "delete it" in refusals[0] or "edit its subjects" in refusals[0]
        # Left as it was, and no replica joined the membership meanwhile.
        info = await js.stream_info("KV_hrwcron_processed")
        assert (info.config.republish is None) == ("republish" not in tamper)
        members = await js.stream_info("KV_hrwcron_members")
        assert members.state.messages == 0
    finally:
        await nc.close()


async def test_worker_groups_get_their_pull_consumers_once(nats_server: NatsServer) -> None:
    extra = ("--worker-group", "reports", "--worker-subject", "hrwcron.trigger.reports.>")
    first = await asyncio.to_thread(provision, nats_server.url, *extra)
    assert first.returncode == 0, first.stderr
    line = first.stdout.splitlines()[-1]
    assert line == (
        "consumer HRWCRON_TRIGGERS/reports: created (pull, subjects hrwcron.trigger.reports.>, "
        "ack wait 30s, max deliver 5)"
    )
    again = await asyncio.to_thread(provision, nats_server.url, *extra)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == line.replace(": created (", ": exists (")
    nc = await nats.connect(nats_server.url)
    try:
        info = await nc.jetstream().consumer_info("HRWCRON_TRIGGERS", "reports")
        assert info.config.deliver_subject is None
        assert info.config.filter_subject == "hrwcron.trigger.reports.>"
    finally:
        await nc.close()


async def test_a_push_consumer_in_a_worker_groups_name_is_refused(nats_server: NatsServer) -> None:
    first = await asyncio.to_thread(provision, nats_server.url)
    assert first.returncode == 0, first.stderr
    nc = await nats.connect(nats_server.url)
    try:
        await nc.jetstream().add_consumer(
            "HRWCRON_TRIGGERS",
            ConsumerConfig(durable_name="pushy", deliver_subject="somewhere.else"),
        )
        done = await asyncio.to_thread(provision, nats_server.url, "--worker-group", "pushy")
        assert done.returncode == 1
        assert "consumer HRWCRON_TRIGGERS/pushy is a push consumer" in done.stderr
    finally:
        await nc.close()


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--worker-subject", "hrwcron.trigger.x"], "--worker-subject needs --worker-group"),
        (["--worker-group", "g", "--worker-subject", "other.x"], "outside the trigger stream"),
        (["--worker-group", "a.b"], "is not a consumer name"),
    ],
)
def test_worker_group_options_are_checked_before_connecting(argv: list[str], said: str) -> None:
    (port,) = free_ports(1)  # nothing listens: a usage error must come first
    done = provision(f"nats://127.0.0.1:{port}", *argv, "--timeout", "1")
    assert done.returncode == 2, done.stderr
    assert said in done.stderr
    assert done.stdout == ""
