"""No valid-looking input may take a replica down: every input that once killed, hung or
confused a replica on a real nats-server, each refused with its field named or handled as
documented, and the replica still standing."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.js.api import RetentionPolicy, StreamConfig

from harness import NatsServer, wait_for_async
from harness.commands import HTTP_AT, hrwcron, replica
from harness.nats import http_get
from hrwcron.adapters.jetstream.pipeline import JetStreamPipeline
from hrwcron.adapters.jetstream.triggers import JetStreamTriggers
from hrwcron.admin import AdminClient, AdminError
from hrwcron.core.model import JobSpec, encode
from hrwcron.engine.ports import StoreRefused

DEADLINE = 30.0
LONG_SUBJECT = ("hrwcron.trigger." + ".".join(["a" * 64] * 70))[:4_520]


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.fixture
async def client(nats_server: NatsServer) -> AsyncIterator[Client]:
    nc = await nats.connect(nats_server.url)
    yield nc
    await nc.close()


async def bucket_state(client: Client) -> tuple[int, int]:
    """(messages, last sequence) of the jobs bucket: unchanged when nothing was written."""
    info = await client.jetstream().stream_info("KV_hrwcron_jobs")
    return int(info.state.messages or 0), int(info.state.last_seq or 0)


async def started_replica(nats_server: NatsServer, tmp_path: Path, node: str, **env: str) -> Any:
    proc = replica(nats_server.url, node, tmp_path / f"{node}.log", **env)
    proc.wait_for_log(rf"replica {node} started", DEADLINE)
    base = proc.wait_for_log(HTTP_AT, DEADLINE).group(1)
    return proc, base


def instance_of(base: str) -> str:
    code, body = http_get(f"{base}/status")
    assert code == 200
    return str(json.loads(body)["instance"])


# --- 1. limits are checked before anything is written ---------------------------------------


async def test_every_reported_poison_spec_is_refused_by_the_api_and_the_cli(
    nats_server: NatsServer, client: Client, tmp_path: Path
) -> None:
    proc, base = await started_replica(nats_server, tmp_path, "p0")
    with proc:
        instance = instance_of(base)
        admin = AdminClient(client, timeout=10)
        before = await bucket_state(client)
        poison: dict[str, tuple[dict[str, Any], str]] = {
            "long subject": ({"subject": LONG_SUBJECT}, "spec.subject"),
            "far @every": ({"schedule": "@every 100000000000000h"}, "spec.schedule"),
            "far @every, latest": (
                {"schedule": "@every 70000000h", "catchup": "latest"},
                "spec.schedule",
            ),
            "long schedule": ({"schedule": "0 " * 200_000 + "*"}, "spec.schedule"),
            "host zone": ({"tz": "localtime"}, "spec.tz"),
            "posix zone": ({"tz": "posix/Europe/Berlin"}, "spec.tz"),
            "leap zone": ({"tz": "right/UTC"}, "spec.tz"),
        }
        for case, (fields, field) in poison.items():
            spec = {"name": "poison", "schedule": "@every 1s", **fields}
            with pytest.raises(AdminError) as refused:
                await admin.call("jobs.put", {"spec": spec}, msgspec.Struct)
            assert (refused.value.code, refused.value.field) == ("bad_request", field), case
        for levels in (983, 997, 5_000):
            data = b'{"spec": {"name": "deep", "schedule": "@every 1s", "payload": '
            data += deep(levels).encode() + b"}}"
            reply = await client.request("hrwcron.admin.jobs.put", data, timeout=10)
            error = json.loads(reply.data)["error"]
            assert (error["code"], error["field"]) == ("bad_request", "spec.payload"), levels
        assert await bucket_state(client) == before

        # The CLI ends each refusal with exit 2 and the message, never a traceback.
        url = nats_server.url
        spec_file = tmp_path / "long-schedule.json"
        spec_file.write_text(json.dumps({"name": "p", "schedule": "0 " * 200_000 + "*"}))
        deep_file = tmp_path / "deep.json"
        deep_file.write_text('{"name": "p", "schedule": "@every 1s", "payload": ' + deep(5_000))
        deep_file.write_text(deep_file.read_text() + "}")
        runs = {
            "subject": ["jobs", "put", "p", "--schedule", "@every 1s", "--subject", LONG_SUBJECT],
            "payload 983": ["jobs", "put", "p", "--schedule", "@every 1s", "--payload", deep(983)],
            "payload 997": ["jobs", "put", "p", "--schedule", "@every 1s", "--payload", deep(997)],
            "file deep": ["jobs", "put", "-f", str(deep_file)],
            "file schedule": ["jobs", "put", "-f", str(spec_file)],
            "zone": ["jobs", "put", "p", "--schedule", "@every 1s", "--tz", "localtime"],
            "every": ["jobs", "put", "p", "--schedule", "@every 100000000000000h"],
            "next": ["next", "@every 100000000000000h"],
        }
        for case, args in runs.items():
            result = await hrwcron(url, *args)
            assert result.code == 2, (case, result)
            assert "error:" in result.err and "Traceback" not in result.err, (case, result.err)
        assert await bucket_state(client) == before

        assert proc.running and instance_of(base) == instance
        assert http_get(f"{base}/readyz")[0] == 200
        assert "Traceback" not in proc.output()


async def test_a_poison_spec_written_around_the_api_is_skipped_and_cannot_be_fired(
    nats_server: NatsServer, client: Client, tmp_path: Path
) -> None:
    proc, base = await started_replica(nats_server, tmp_path, "p1")
    with proc:
        instance = instance_of(base)
        kv = await client.jetstream().key_value("hrwcron_jobs")
        await kv.put("steady", encode(JobSpec(name="steady", schedule="@every 1s")))
        for name, extra in {
            "longsubject": {"subject": ("hrwcron.trigger." + "b." * 3000)[:5_415] + "b"},
            "farevery": {"schedule": "@every 70000000h", "catchup": "latest"},
            "hostzone": {"tz": "localtime"},
        }.items():
            await kv.put(name, encode({"name": name, "schedule": "@every 1s", **extra}))
            proc.wait_for_log(rf"job '{name}' skipped", DEADLINE)
        admin = AdminClient(client, timeout=10)
        with pytest.raises(AdminError) as refused:
            await admin.trigger("longsubject", "x")
        assert refused.value.code == "conflict" and "stored but invalid" in refused.value.message

        async def steady_fires() -> bool:
            info = await client.jetstream().stream_info(
                "HRWCRON_TRIGGERS", subjects_filter="hrwcron.trigger.>"
            )
            return (info.state.subjects or {}).get("hrwcron.trigger.steady", 0) >= 3

        await wait_for_async(steady_fires, DEADLINE, message="steady keeps firing")
        assert proc.running and instance_of(base) == instance
        assert "jobs watch stopped" not in proc.output()
        assert "Traceback" not in proc.output()


def test_a_replica_whose_max_payload_does_not_fit_the_server_refuses_to_start(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    proc = replica(
        nats_server.url,
        "big",
        tmp_path / "big.log",
        HRWCRON_SCHEDULER_MAX_PAYLOAD="1048576",
    )
    with proc:
        assert proc.wait(DEADLINE) == 1
        assert "lower scheduler.max_payload to at most 1040384" in proc.output()
        assert "Traceback" not in proc.output()


# --- 2. a replica never dies of a job -------------------------------------------------------


async def test_a_trigger_the_stream_refuses_fails_its_tick_and_the_replica_stays_up(
    nats_server: NatsServer, client: Client, tmp_path: Path
) -> None:
    # The stream takes no message over 4 KiB: a trigger with a 5,000-byte payload is refused.
    await client.jetstream().add_stream(
        StreamConfig(
            name="HRWCRON_TRIGGERS",
            subjects=["hrwcron.trigger.>"],
            retention=RetentionPolicy.LIMITS,
            max_age=86_400,
            duplicate_window=600,
            max_msg_size=4096,
            allow_direct=True,
        )
    )
    proc, base = await started_replica(nats_server, tmp_path, "p2")
    with proc:
        admin = AdminClient(client, timeout=10)
        await admin.put_job(JobSpec(name="fat", schedule="@every 1s", payload="x" * 5000), 0)
        await admin.put_job(JobSpec(name="good", schedule="@every 1s"), 0)

        async def fat_is_bad() -> Any:
            status = await admin.status("fat")
            return status if status.jobs and status.jobs[0].problem else None

        status = await wait_for_async(fat_is_bad, DEADLINE, message="fat marked bad")
        assert "refused its trigger" in status.jobs[0].problem

        async def fired(job: str) -> int:
            info = await client.jetstream().stream_info(
                "HRWCRON_TRIGGERS", subjects_filter="hrwcron.trigger.>"
            )
            return int((info.state.subjects or {}).get(f"hrwcron.trigger.{job}", 0))

        good_before = await fired("good")

        async def good_goes_on() -> bool:
            return await fired("good") >= good_before + 3

        await wait_for_async(good_goes_on, DEADLINE, message="good keeps firing")
        assert await fired("fat") == 0
        code, metrics = http_get(f"{base}/metrics")
        assert code == 200
        rejected = [
            line
            for line in metrics.decode().splitlines()
            if line.startswith("hrwcron_ticks_total") and 'outcome="rejected"' in line
        ]
        assert rejected and any(float(line.rsplit(" ", 1)[1]) >= 2 for line in rejected), rejected
        output = proc.output()
        assert output.count("job 'fat': the server refused its trigger") == 1, output[-2000:]
        assert "nats: disconnected" not in output and "Traceback" not in output
        assert http_get(f"{base}/readyz")[0] == 200
        status_doc = json.loads(http_get(f"{base}/status")[1])
        assert any(b["name"] == "fat" for b in status_doc["bad_jobs"])
        cli = await hrwcron(nats_server.url, "status")
        assert cli.code == 0 and "fat: BAD: the server refused its trigger" in cli.out


async def test_a_trigger_larger_than_the_server_takes_is_refused_before_it_is_sent(
    client: Client,
) -> None:
    js = client.jetstream()
    await js.add_stream(StreamConfig(name="T", subjects=["t.>"]))
    triggers = JetStreamTriggers(js, "T", "t", JetStreamPipeline(client))
    body = b"x" * (client.max_payload - 20)  # fits alone, not with its headers
    with pytest.raises(StoreRefused, match="max_payload"):
        await triggers.publish("t.big", body, {"Nats-Msg-Id": "big:1"}, 0)
    with pytest.raises(StoreRefused, match="subject"):
        await triggers.publish(LONG_SUBJECT, b"{}", {"Nats-Msg-Id": "long:1"}, 0)
    # The connection is still there and still works (the server would have reset it).
    assert client.is_connected
    ack = await triggers.publish("t.small", b"{}", {"Nats-Msg-Id": "small:1"}, 0)
    assert ack.seq == 1
