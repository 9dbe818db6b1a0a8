"""Triggers from real replicas on a real nats-server against their contract (docs/triggers.md):
every body the Python worker SDK receives conforms to docs/schema/trigger-v1.json and decodes
to the same values, for every kind of trigger; and with ``scheduler.cloudevents`` on, the
CloudEvents Python SDK reads a stored trigger and a delivered one as the event the page says,
while with it off no trigger carries a ``ce-`` header."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_binary_event
from cloudevents.v1.http import from_http

from harness import wait_for_async
from harness.inprocess_replicas import Cluster
from harness.trigger_contract import check_trigger
from hrwcron.core.model import JobSpec
from hrwcron.core.ticks import format_ms
from hrwcron.worker import Trigger, Worker

DEADLINE = 30.0


@dataclass
class Received:
    trigger: Trigger
    data: bytes


class Collector:
    """A worker handler that keeps every delivery it ran."""

    def __init__(self) -> None:
        self.received: list[Received] = []

    async def __call__(self, trigger: Trigger) -> None:
        self.received.append(Received(trigger, bytes(trigger.msg.data)))

    def of(self, job: str) -> list[Received]:
        return [r for r in self.received if r.trigger.job == job]


def ce_headers(headers: dict[str, str]) -> list[str]:
    return [k for k in headers if k.lower().startswith("ce-") or k.lower() == "content-type"]


async def test_every_kind_of_real_trigger_conforms_and_the_sdk_reads_it_whole(
    nats_url: str,
) -> None:
    cluster = await Cluster.start(nats_url, {"a": {}, "b": {}})
    handled = Collector()
    worker = Worker(
        cluster.client, handled, durable="contract", subjects="hrwcron.trigger.contract.>"
    )
    await worker.start()
    try:
        admin = cluster.admin
        payload = {"report": "daily", "to": ["ops@example.com"], "depth": {"a": [1, None, 2.5]}}
        await admin.put_job(
            JobSpec(name="contract.every", schedule="@every 1s", max_lateness=1, payload=payload)
        )
        await admin.put_job(JobSpec(name="contract.counted", schedule="@every 1s", max_runs=3))
        manual = await admin.trigger("contract.every", "by-hand-1")
        now = int(time.time() * 1000) // 1000 * 1000
        # Instants from before the job existed: only a backfill fires them.
        filled = await admin.backfill(
            "contract.every", format_ms(now - 9000), format_ms(now - 5000)
        )
        assert len(filled.published) == 5

        def enough() -> bool:
            kinds = Counter(r.trigger.message.kind for r in handled.of("contract.every"))
            counted = len(handled.of("contract.counted"))
            return (
                kinds["scheduled"] >= 3
                and kinds["manual"] == 1
                and kinds["backfill"] == 5
                and counted == 3
            )

        await wait_for_async(enough, timeout=DEADLINE, message="every kind of trigger handled")

        for received in handled.received:
            trigger = received.trigger
            headers = dict(trigger.headers)
            body = check_trigger(received.data, headers)
            assert msgspec.to_builtins(trigger.message) == body
            assert trigger.tick == body["tick"]
            assert ce_headers(headers) == [], headers  # scheduler.cloudevents is off
        assert manual.tick in {r.trigger.tick for r in handled.of("contract.every")}
        runs = sorted(int(r.trigger.headers["Hrwcron-Run"]) for r in handled.of("contract.counted"))
        assert runs == [1, 2, 3]
        # What the stream keeps is what was delivered: the same bodies and headers.
        stored = []
        for job in ("contract.every", "contract.counted"):
            for record in await cluster.stored(job):
                check_trigger(record.body, dict(record.headers))
                assert ce_headers(dict(record.headers)) == [], record.headers
                stored.append(record.msg_id)
        ran = [r.trigger.tick for r in handled.received]
        assert len(ran) == len(set(ran))
        assert set(ran) <= set(stored)
        assert set(filled.published) <= set(ran)
    finally:
        await worker.stop()
        await cluster.stop()


SOURCES = {
    "default source": ("", "/hrwcron/hrwcron.trigger"),
    "own source with an escape": (
        "https://cron.example.com/eu%20west",
        "https://cron.example.com/eu%20west",
    ),
}


@pytest.mark.parametrize("case", SOURCES)
async def test_with_cloudevents_on_a_real_trigger_reads_as_a_cloudevent(
    nats_url: str, case: str
) -> None:
    configured, expected_source = SOURCES[case]
    options: dict[str, Any] = {"cloudevents": True, "cloudevents_source": configured}
    cluster = await Cluster.start(nats_url, {"a": options, "b": options})
    handled = Collector()
    worker = Worker(cluster.client, handled, durable="events", subjects="hrwcron.trigger.ce.>")
    await worker.start()
    try:
        await cluster.admin.put_job(
            JobSpec(name="ce.every", schedule="@every 1s", payload={"n": [1, 2]})
        )
        manual = await cluster.admin.trigger("ce.every", "poke")
        await wait_for_async(
            lambda: (
                len(handled.received) >= 3
                and manual.tick in {r.trigger.tick for r in handled.received}
            ),
            timeout=DEADLINE,
            message="scheduled and manual triggers handled",
        )
        stored = await cluster.stored("ce.every")
        seen: list[tuple[dict[str, str], bytes]] = [(dict(r.headers), r.body) for r in stored]
        seen += [(dict(r.trigger.headers), r.data) for r in handled.received]
        kinds = set()
        for headers, data in seen:
            body = check_trigger(data, headers)
            kinds.add(body["kind"])
            due = datetime.fromtimestamp(body["due_ms"] / 1000, tz=UTC)
            event = from_binary_event(HTTPMessage(headers=headers, body=data))
            assert event.get_specversion() == "1.0"
            assert event.get_id() == headers["Nats-Msg-Id"] == body["tick"]
            assert event.get_source() == expected_source
            assert event.get_type() == "io.hrwcron.tick"
            assert event.get_time() == due
            assert event.get_subject() == "ce.every"
            assert event.get_datacontenttype() == "application/json"
            assert event.get_data() == body
            # The SDK's older reader, binary mode by the HTTP binding, reads it as well.
            legacy = from_http(headers, data)
            assert (legacy["id"], legacy["type"], legacy["subject"]) == (
                body["tick"],
                "io.hrwcron.tick",
                "ce.every",
            )
            assert legacy.data == body
        assert kinds == {"scheduled", "manual"}
    finally:
        await worker.stop()
        await cluster.stop()
