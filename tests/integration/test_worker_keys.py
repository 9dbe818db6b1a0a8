"""Issue 25, worker SDK, on a real nats-server: processed-record keys that no two ticks share,
records of earlier versions honoured for triggers they may have run, and any exception a
handler raises treated as a failure of that run.

The key collision is reproduced as the issue found it: a replica fires job ``sec.manual`` at T
while ``hrwcron trigger sec --id T`` fired job ``sec`` by hand; both must run. The exception
cases drive the worker's own delivery path (``Worker.handle``) with a real JetStream message,
so a ``KeyboardInterrupt`` that escapes reaches the test, not the event loop pytest runs on.
"""

from __future__ import annotations

import gc
import logging
import time

import msgspec
import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError
from prometheus_client import CollectorRegistry

from harness import wait_for_async
from harness.commands import hrwcron
from harness.inprocess_replicas import Cluster
from harness.worker_records import STREAM, marker, publish
from hrwcron.core.model import JobSpec, TriggerMessage, encode
from hrwcron.core.ticks import format_ms
from hrwcron.worker import DONE, Processed, Trigger, Worker

DEADLINE = 30.0
PROCESSED = "hrwcron_processed"


def logged(caplog: pytest.LogCaptureFixture, *words: str) -> bool:
    return any(all(w in r.getMessage() for w in words) for r in caplog.records)


async def record_state(nc: Client, key: str) -> str | None:
    kv = await nc.jetstream().key_value(PROCESSED)
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    return str(msgspec.json.decode(entry.value or b"{}").get("state"))


# --- 1. a manual trigger of `sec` and a scheduled tick of `sec.manual` at the same T ----------


async def test_a_manual_trigger_and_a_scheduled_tick_that_shared_a_key_both_run(
    nats_url: str,
) -> None:
    cluster = await Cluster.start(nats_url, {"k0": {}})
    nc = await nats.connect(nats_url)
    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)

    worker = Worker(nc, handler, durable="keys", ack_wait=5.0, heartbeat=0.5)
    try:
        await worker.start()
        admin = cluster.admin
        # T a few seconds ahead, on a whole second: the instant `sec.manual` is due.
        due = (int(time.time()) + 8) * 1000
        await admin.put_job(JobSpec(name="sec", schedule="0 0 1 1 *"), 0)
        await admin.put_job(JobSpec(name="sec.manual", schedule=f"@at {format_ms(due)}"), 0)
        manual, scheduled = f"sec:manual:{due}", f"sec.manual:{due}"

        fired = await hrwcron(nats_url, "trigger", "sec", "--id", str(due))
        assert fired.code == 0 and fired.out.startswith(f"{manual}: published by "), fired
        await wait_for_async(lambda: manual in runs, DEADLINE, message="the manual trigger runs")
        assert await worker.processed.state(manual) == DONE  # type: ignore[union-attr]

        # The replica fires `sec.manual` at T; the old key made it a duplicate of the above.
        await wait_for_async(
            lambda: scheduled in runs, DEADLINE, message="the scheduled tick of sec.manual runs"
        )
        assert await cluster.ticks("sec") == [manual]
        assert await cluster.ticks("sec.manual") == [scheduled]
        await wait_for_async(lambda: worker.stats.handled == 2, DEADLINE)
        assert sorted(runs) == sorted([manual, scheduled])
        assert worker.stats.duplicates == 0 and worker.stats.failed == 0
        assert await record_state(nc, f"keys.sec.manual.{due}") == DONE
        assert await record_state(nc, f"keys.sec.manual.due.{due}") == DONE
    finally:
        await worker.stop()
        await nc.close()
        await cluster.stop()


# --- 2. records written by earlier versions -----------------------------------------------------


async def legacy_done(nc: Client, key: str) -> None:
    """A done record under ``key`` as versions before issue 25 wrote it."""
    kv = await nc.jetstream().key_value(PROCESSED)
    record = {"state": "done", "owner": "old-worker/1", "at_ms": int(time.time() * 1000)}
    await kv.put(key, msgspec.json.encode(record))


async def test_a_legacy_done_record_counts_only_for_triggers_stored_before_the_worker_started(
    nc: Client,
) -> None:
    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)

    await Processed.open(nc.jetstream(), namespace="mig")  # the bucket, as a worker makes it
    # An earlier worker ran `legacy:1000` (legacy key `mig.legacy.1000`), and `sec:manual:7`
    # (legacy key `mig.sec.manual.7`, the one the scheduled tick `sec.manual:7` shared).
    await legacy_done(nc, "mig.legacy.1000")
    await legacy_done(nc, "mig.sec.manual.7")
    ran_before = await publish(nc, "legacy", 1_000)  # stored while no worker of today ran
    fresh = await publish(nc, "legacy", 2_000)

    # deliver_new=False: the consumer, made now, also delivers what the stream already holds.
    worker = Worker(
        nc,
        handler,
        durable="mig",
        subjects="hrwcron.trigger.>",
        ack_wait=5.0,
        heartbeat=0.5,
        deliver_new=False,
    )
    await worker.start()
    try:
        await wait_for_async(lambda: worker.stats.handled == 1, DEADLINE, message="fresh runs")
        await wait_for_async(lambda: worker.stats.duplicates == 1, DEADLINE)
        assert runs == [fresh]  # the one the earlier worker ran is not run again
        assert await worker.processed.state(ran_before) == DONE  # type: ignore[union-attr]

        # Stored after this worker started: its legacy key's record is another tick's.
        late = await publish(nc, "sec.manual", 7)
        await wait_for_async(lambda: late in runs, DEADLINE, message="sec.manual:7 runs")
        assert worker.stats.duplicates == 1
    finally:
        await worker.stop()


async def test_a_hostile_tick_key_is_not_taken_for_another_ticks_record(nc: Client) -> None:
    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)

    worker = Worker(nc, handler, durable="wild", ack_wait=5.0, heartbeat=0.5, max_deliver=2)
    await worker.start()
    try:
        real = await publish(nc, "x.y", 5)
        await wait_for_async(lambda: worker.stats.handled == 1, DEADLINE)
        # Published by hand, as any client with publish rights on the stream can: its
        # Nats-Msg-Id names a job no replica could have (`x.*` is not a job name).
        hostile = "x.*:5"
        body = TriggerMessage(
            job="x", tick=hostile, due="", due_ms=5, fired_at="", node="hand", attempt=1
        )
        await nc.jetstream().publish(
            "hrwcron.trigger.x", encode(body), headers={"Nats-Msg-Id": hostile}
        )
        await wait_for_async(lambda: worker.stats.handled + worker.stats.duplicates >= 2, DEADLINE)
        assert runs == [real, hostile]
    finally:
        await worker.stop()


# --- 3. a handler raising a BaseException subclass ----------------------------------------------


class Abort(BaseException):
    """Neither an Exception nor a CancelledError (gevent's GreenletExit, trio's Cancelled...)."""


async def test_a_base_exception_from_a_handler_fails_the_run_and_is_retried(
    nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    deliveries: list[tuple[int, bool]] = []

    async def handler(trigger: Trigger) -> None:
        deliveries.append((trigger.delivered, trigger.takeover))
        if trigger.delivered == 1:
            raise Abort("aborted")

    # ack_wait is longer than the deadline: only a nak brings the trigger back in time.
    worker = Worker(nc, handler, durable="abort", ack_wait=60.0, heartbeat=0.5, backoff=[0.2])
    registry = CollectorRegistry()
    registry.register(worker.metrics())
    await worker.start()
    try:
        tick = await publish(nc, "abort", 1_000)
        await wait_for_async(lambda: worker.stats.handled == 1, DEADLINE, message="retried")
        assert deliveries == [(1, False), (2, False)]  # redelivered by the nak, no takeover
        assert worker.stats.failed == 1 and worker.stats.takeovers == 0
        assert await worker.processed.state(tick) == DONE  # type: ignore[union-attr]
        assert await marker(nc, "abort") is None
        events = {"durable": "abort", "event": "failed"}
        assert registry.get_sample_value("hrwcron_worker_events_total", events) == 1
        assert logged(caplog, tick, "failed on delivery 1", "Abort")
    finally:
        await worker.stop()
    gc.collect()  # an unretrieved task exception is reported when the task is collected
    assert not logged(caplog, "exception was never retrieved")
    assert not logged(caplog, "delivery on", "failed unexpectedly")


# --- 4. KeyboardInterrupt and SystemExit: released, then raised -------------------------------


@pytest.mark.parametrize("stop", [KeyboardInterrupt, SystemExit])
async def test_a_process_stop_raised_in_a_handler_releases_the_tick_then_propagates(
    nc: Client, stop: type[BaseException]
) -> None:
    durable = f"stop-{stop.__name__.lower()}"
    deliveries: list[int] = []

    async def handler(trigger: Trigger) -> None:
        deliveries.append(trigger.delivered)
        if trigger.delivered == 1:
            raise stop()

    worker = Worker(nc, handler, durable=durable, ack_wait=60.0, heartbeat=0.5, backoff=[0.2])
    # Consumer, buckets and markers as start() makes them; then its own pull loop is stopped,
    # so this test takes the deliveries and the exception comes back to it.
    await worker.start()
    await worker.stop()
    sub = await nc.jetstream().pull_subscribe_bind(durable=durable, stream=STREAM)
    try:
        tick = await publish(nc, durable, 1_000)
        (first,) = await sub.fetch(1, timeout=DEADLINE)
        with pytest.raises(stop):
            await worker.handle(first)
        # Released for the next delivery, not left running until its lease lapses.
        assert await worker.processed.state(tick) == "released"  # type: ignore[union-attr]
        assert await marker(nc, durable) is None
        assert worker.stats.failed == 1 and worker.stats.handled == 0

        # Nak'd: back within the deadline although ack_wait is a minute.
        (second,) = await sub.fetch(1, timeout=DEADLINE)
        assert second.metadata.num_delivered == 2
        await worker.handle(second)
        assert deliveries == [1, 2]
        assert worker.stats.handled == 1 and worker.stats.takeovers == 0
        assert await worker.processed.state(tick) == DONE  # type: ignore[union-attr]
    finally:
        await sub.unsubscribe()
