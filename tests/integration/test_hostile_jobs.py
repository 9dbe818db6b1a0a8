"""Hostile writes on a real server: malformed jobs put straight into the jobs bucket by another
client, and garbage published on a job's trigger subject. A replica process skips what it cannot
use, says so (log, metric, /status) and keeps firing every other job."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.aio.client import Client

from harness import NatsServer, http_get, wait_for_async
from harness.commands import HTTP_AT, replica
from hrwcron.core.model import JobSpec, encode

DEADLINE = 30.0


@pytest.fixture
async def client(provisioned: Client) -> Client:
    return provisioned


# Written by "another client": bytes the admin API and the CLI would never let through.
BAD_BEFORE_START = {
    "broken": (b"{not json", "is not JSON"),
    "wrongtype": (b'{"name": "wrongtype", "schedule": 5}', "Expected `str`"),
    "wildcard": (encode({"name": "a.*", "schedule": "@every 1s"}), "holds job 'a.*'"),
}
BAD_AFTER_START = {
    "badsched": (encode({"name": "badsched", "schedule": "61 * * * *"}), "schedule"),
    "huge": (
        encode({"name": "huge", "schedule": "@every 1s", "payload": "x" * 70_000}),
        "the limit is 65536 bytes",
    ),
    "unknown": (encode({"name": "unknown", "schedule": "@every 1s", "shell": "rm"}), "shell"),
}


async def good_ticks(client: Client, job: str) -> list[str]:
    js = client.jetstream()
    sub = await js.subscribe(f"hrwcron.trigger.{job}", ordered_consumer=True)
    found: list[str] = []
    try:
        pending = (await sub.consumer_info()).num_pending or 0
        for _ in range(pending):
            msg = await sub.next_msg(timeout=5)
            found.append((msg.headers or {}).get("Nats-Msg-Id", ""))
    finally:
        await sub.unsubscribe()
    return found


async def subjects_with_triggers(client: Client) -> set[str]:
    info = await client.jetstream().stream_info("HRWCRON_TRIGGERS", subjects_filter=">")
    return set((info.state.subjects or {}).keys())


async def test_malformed_jobs_written_by_another_client_are_skipped_and_the_rest_keep_firing(
    client: Client, tmp_path: Path, nats_server: NatsServer
) -> None:
    js = client.jetstream()
    kv = await js.key_value("hrwcron_jobs")
    await kv.put("good", encode(JobSpec(name="good", schedule="@every 1s")))
    for key, (raw, _) in BAD_BEFORE_START.items():
        await kv.put(key, raw)

    with replica(nats_server.url, "h0", tmp_path / "h0.log") as proc:
        proc.wait_for_log(r"replica h0 started", DEADLINE)
        base = proc.wait_for_log(HTTP_AT, DEADLINE).group(1)
        for key, (raw, _) in BAD_AFTER_START.items():
            await kv.put(key, raw)
        first = len(await good_ticks(client, "good"))

        # Each bad key is reported once per revision, naming the key and what is wrong.
        for key, (_, why) in {**BAD_BEFORE_START, **BAD_AFTER_START}.items():
            line = proc.wait_for_log(rf"WARNING .*job '{key}' skipped: .*", DEADLINE).group(0)
            assert why in line, line
        assert "Traceback" not in proc.output()

        async def status() -> dict[str, Any] | None:
            code, body = http_get(f"{base}/status")
            doc: dict[str, Any] = json.loads(body)
            names = {b["name"] for b in doc["bad_jobs"]}
            return doc if code == 200 and len(names) == 6 else None

        doc = await wait_for_async(status, DEADLINE, message="/status listing the 6 bad jobs")
        assert doc is not None and doc["ready"] and [j["name"] for j in doc["jobs"]] == ["good"]
        errors = {b["name"]: b["error"] for b in doc["bad_jobs"]}
        assert "the limit is 65536 bytes" in errors["huge"]
        code, metrics = http_get(f"{base}/metrics")
        assert code == 200
        bad_total = re.search(rb"^hrwcron_bad_jobs_total (\S+)$", metrics, re.MULTILINE)
        assert bad_total is not None and float(bad_total.group(1)) >= 6

        # The good job keeps firing after every bad write; no bad one ever fired.
        await wait_for_async(
            lambda: _more_than(client, "good", first + 3),
            DEADLINE,
            message="good keeps firing after the bad writes",
        )
        assert await subjects_with_triggers(client) == {"hrwcron.trigger.good"}
        assert proc.running
    # Skipping is read-only: what the other client stored is still there, byte for byte.
    for key, (raw, _) in {**BAD_BEFORE_START, **BAD_AFTER_START}.items():
        assert (await kv.get(key)).value == raw


async def _more_than(client: Client, job: str, count: int) -> bool:
    return len(await good_ticks(client, job)) > count


async def test_garbage_on_a_trigger_subject_neither_crashes_a_replica_nor_stops_the_job(
    client: Client, tmp_path: Path, nats_server: NatsServer
) -> None:
    kv = await client.jetstream().key_value("hrwcron_jobs")
    await kv.put("steady", encode(JobSpec(name="steady", schedule="@every 1s")))
    with replica(nats_server.url, "h0", tmp_path / "h0.log") as proc:
        proc.wait_for_log(r"replica h0 started", DEADLINE)
        await wait_for_async(
            lambda: _more_than(client, "steady", 1), DEADLINE, message="steady fires"
        )
        js = client.jetstream()
        garbage: list[tuple[bytes, dict[str, str] | None]] = [
            (b"\x00\xff\xfe", None),
            (b"{}", {"Hrwcron-Watermark": "not a number", "Nats-Msg-Id": "x"}),
            (b"[1, 2", {"Hrwcron-Watermark": "-5", "Hrwcron-Job": "*"}),
            (msgspec.json.encode({"job": 7, "due_ms": "soon"}), {"Hrwcron-Kind": "manual"}),
        ]
        for body, headers in garbage:
            await js.publish("hrwcron.trigger.steady", body, headers=headers)
        before = len(await good_ticks(client, "steady"))
        # Fencing now expects the garbage's sequence; the replica re-reads it and goes on.
        await wait_for_async(
            lambda: _more_than(client, "steady", before + 3),
            DEADLINE,
            message="steady keeps firing after garbage on its subject",
        )
        assert proc.running
        assert "Traceback" not in proc.output()
