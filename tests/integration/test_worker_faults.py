"""The worker SDK under faults, on a real nats-server: cancelled handlers, failing and slow KV
writes, consumer settings that cannot work, tombstones, overlapping runs, a graceful stop, and
a worker killed between its handler's return and the done record.

Faults come from the server itself (a bucket deleted under the worker), a TCP proxy between
worker and server (slow replies), and the SDK's failpoints (``HRWCRON_FAILPOINTS``)."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import nats
import pytest
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig
from prometheus_client import CollectorRegistry

from harness import NatsServer, TcpProxy, wait_for_async
from harness.worker_records import STREAM, marker, publish, revision, settled
from harness.workers import read_runs, worker_process
from hrwcron import worker as sdk
from hrwcron.adapters.jetstream.claims import JetStreamRuns
from hrwcron.core.errors import HrwcronError
from hrwcron.engine.failpoints import ENV as FAILPOINTS
from hrwcron.worker import DONE, Processed, Trigger, Worker
from hrwcron.worker.records import tick_record_key

DEADLINE = 20.0


def logged(caplog: pytest.LogCaptureFixture, *words: str) -> bool:
    return any(all(w in r.getMessage() for w in words) for r in caplog.records)


# --- 1. cancelled handlers ----------------------------------------------------------------------


async def test_stop_cancelling_a_long_handler_gives_the_trigger_to_the_next_worker(
    nc: Client, nats_url: str
) -> None:
    started = asyncio.Event()

    async def endless(trigger: Trigger) -> None:
        started.set()
        await asyncio.Event().wait()

    first = Worker(nc, endless, durable="cancel", ack_wait=2.0, heartbeat=0.3)
    await first.start()
    tick = await publish(nc, "cancel", 1_000)
    await wait_for_async(started.is_set, timeout=DEADLINE, message="the long handler runs")
    await first.stop(timeout=0.2)  # too short for the handler: it is cancelled

    runs: list[Trigger] = []

    async def quick(trigger: Trigger) -> None:
        runs.append(trigger)

    other = await nats.connect(nats_url)  # the first connection stays open
    second = Worker(other, quick, durable="cancel", ack_wait=2.0, heartbeat=0.3)
    await second.start()
    try:
        await wait_for_async(lambda: runs, timeout=DEADLINE, message="the next worker runs it")
        assert [(t.tick, t.delivered, t.takeover) for t in runs] == [(tick, 2, False)]
        await wait_for_async(lambda: second.stats.handled == 1, timeout=DEADLINE)
        assert first.stats.interrupted == 1 and first.stats.handled == 0
        assert await second.processed.state(tick) == DONE  # type: ignore[union-attr]
        assert not await JetStreamRuns(await nc.jetstream().key_value("hrwcron_runs")).running(
            "cancel"
        )
    finally:
        await second.stop()
        await other.close()


async def test_a_handler_raising_cancelled_error_is_a_failure_and_retried(nc: Client) -> None:
    deliveries: list[int] = []

    async def handler(trigger: Trigger) -> None:
        deliveries.append(trigger.delivered)
        if trigger.delivered == 1:
            raise asyncio.CancelledError  # e.g. an inner task it awaited was cancelled

    worker = Worker(nc, handler, durable="selfcancel", ack_wait=2.0, heartbeat=0.3, backoff=[0.2])
    await worker.start()
    try:
        tick = await publish(nc, "selfcancel", 1_000)
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
        assert deliveries == [1, 2]
        assert worker.stats.failed == 1
        assert await worker.processed.state(tick) == DONE  # type: ignore[union-attr]
    finally:
        await worker.stop()


# --- 2. errors outside the handler --------------------------------------------------------------


async def test_run_markers_unavailable_do_not_stop_triggers(
    nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)

    worker = Worker(nc, handler, durable="nomarkers", ack_wait=1.0, heartbeat=0.3, max_deliver=2)
    await worker.start()
    try:
        await nc.jetstream().delete_stream("KV_hrwcron_runs")
        tick = await publish(nc, "nomarkers", 1_000)
        await wait_for_async(lambda: runs, timeout=DEADLINE, message="the handler runs")
        await wait_for_async(lambda: settled(nc, "nomarkers"), timeout=DEADLINE)
        assert runs == [tick]
        assert worker.stats.handled == 1 and worker.stats.errors >= 1
        assert logged(caplog, tick, "run marker")
    finally:
        await worker.stop()


async def test_an_unavailable_processed_bucket_holds_the_trigger_until_it_returns(
    nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[Trigger] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger)

    worker = Worker(nc, handler, durable="noprocessed", ack_wait=1.0, heartbeat=0.3, max_deliver=2)
    await worker.start()
    try:
        js = nc.jetstream()
        await js.delete_stream("KV_hrwcron_processed")
        tick = await publish(nc, "noprocessed", 1_000)
        await wait_for_async(
            lambda: logged(caplog, tick, "processed record"),
            timeout=DEADLINE,
            message="the failing record write is logged with its tick",
        )
        # Longer than ack_wait times max_deliver: without the in-progress acks of a held
        # delivery the trigger would be dropped by now.
        await wait_for_async(
            lambda: worker.stats.errors >= 8, timeout=DEADLINE, message="retries go on"
        )
        assert runs == []
        await Processed.open(js, namespace="unused")  # the bucket is back
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
        assert [(t.tick, t.delivered) for t in runs] == [(tick, 1)]
        assert await settled(nc, "noprocessed")
    finally:
        await worker.stop()


async def test_a_failed_done_record_does_not_run_the_handler_twice(
    nc: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAILPOINTS, "worker_finish=error@nofinish")
    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)

    worker = Worker(nc, handler, durable="nofinish", ack_wait=1.0, heartbeat=0.3)
    await worker.start()
    try:
        tick = await publish(nc, "nofinish", 1_000)
        await wait_for_async(lambda: worker.stats.handled >= 1, timeout=DEADLINE)
        await wait_for_async(lambda: settled(nc, "nofinish"), timeout=DEADLINE)
        assert runs == [tick]
        assert worker.stats.errors == 1
        assert logged(caplog, tick, "done record")
    finally:
        await worker.stop()


async def test_a_failed_ack_is_logged_and_the_redelivery_is_not_run(
    nc: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(FAILPOINTS, "worker_ack=error@noack")
    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)

    worker = Worker(nc, handler, durable="noack", ack_wait=1.0, heartbeat=0.3)
    await worker.start()
    try:
        tick = await publish(nc, "noack", 1_000)
        await wait_for_async(lambda: worker.stats.duplicates == 1, timeout=DEADLINE)
        await wait_for_async(lambda: settled(nc, "noack"), timeout=DEADLINE)
        assert runs == [tick]
        assert worker.stats.errors == 1
        assert logged(caplog, tick, "ack")
    finally:
        await worker.stop()


async def test_a_trigger_given_up_is_logged_and_counted(
    nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    deliveries: list[int] = []

    async def broken(trigger: Trigger) -> None:
        deliveries.append(trigger.delivered)
        raise RuntimeError("always fails")

    worker = Worker(
        nc, broken, durable="giveup", ack_wait=2.0, heartbeat=0.3, max_deliver=2, backoff=[0.2]
    )
    registry = CollectorRegistry()
    registry.register(worker.metrics())
    await worker.start()
    try:
        tick = await publish(nc, "giveup", 1_000)
        await wait_for_async(lambda: worker.stats.given_up == 1, timeout=DEADLINE)
        await wait_for_async(lambda: settled(nc, "giveup"), timeout=DEADLINE)
        assert deliveries == [1, 2]
        assert logged(caplog, tick, "giving up")
        labels = {"durable": "giveup"}
        assert (
            registry.get_sample_value(
                "hrwcron_worker_events_total", {**labels, "event": "given_up"}
            )
            == 1
        )
        assert (
            registry.get_sample_value("hrwcron_worker_events_total", {**labels, "event": "failed"})
            == 2
        )
    finally:
        await worker.stop()


# --- 3. bucket replicas: see test_worker_buckets_follow_the_stream (cluster) -------------------

# --- 4. a heartbeat write in flight when the handler returns ------------------------------------


async def test_a_heartbeat_write_in_flight_when_the_handler_returns_is_kept(
    nc: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each failpoint holds the heartbeat just after its write landed, before the worker stored
    # the new revision; the handler returns exactly then.
    monkeypatch.setenv(
        FAILPOINTS, "worker_beat_written=sleep:1@beat.record,worker_marker_written=sleep:1@beat.run"
    )

    async def handler(trigger: Trigger) -> None:
        if trigger.job == "beat.record":
            key = f"beats.{tick_record_key(trigger.tick)}"
            begun = await revision(nc, "hrwcron_processed", key)
            await wait_for_async(
                lambda: _advanced(nc, "hrwcron_processed", key, begun), timeout=DEADLINE
            )
        else:
            begun = await revision(nc, "hrwcron_runs", trigger.job)
            await wait_for_async(
                lambda: _advanced(nc, "hrwcron_runs", trigger.job, begun), timeout=DEADLINE
            )

    worker = Worker(
        nc,
        handler,
        durable="beats",
        subjects="hrwcron.trigger.beat.>",
        ack_wait=3.0,
        heartbeat=0.3,
    )
    await worker.start()
    try:
        record = await publish(nc, "beat.record", 1_000)
        await publish(nc, "beat.run", 1_000)
        await wait_for_async(lambda: worker.stats.handled == 2, timeout=DEADLINE)
        assert await worker.processed.state(record) == DONE  # type: ignore[union-attr]
        assert await marker(nc, "beat.run") is None
        assert worker.stats.lease_lost == 0
    finally:
        await worker.stop()


async def _advanced(nc: Client, bucket: str, key: str, since: int) -> bool:
    return await revision(nc, bucket, key) > since


async def test_slow_replies_neither_lose_nor_repeat_a_tick(
    nc: Client, nats_server: NatsServer
) -> None:
    proxy = TcpProxy.to(nats_server)
    slow = await nats.connect(proxy.url)
    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)
        key = f"slow.{tick_record_key(trigger.tick)}"
        begun = await revision(nc, "hrwcron_processed", key)
        # Two heartbeats landed: the handler spans writes in flight.
        for _ in range(2):
            seen = await revision(nc, "hrwcron_processed", key)
            await wait_for_async(
                lambda seen=seen: _advanced(nc, "hrwcron_processed", key, seen),  # type: ignore[misc]
                timeout=DEADLINE,
            )
        assert await revision(nc, "hrwcron_processed", key) > begun

    worker = Worker(slow, handler, durable="slow", ack_wait=4.0, heartbeat=0.3, concurrency=3)
    try:
        await worker.start()
        proxy.slow(0.1)  # every chunk, each way: each KV write takes at least 0.2 s
        ticks = [await publish(nc, "slow", due) for due in (1_000, 2_000, 3_000)]
        await wait_for_async(lambda: worker.stats.handled == 3, timeout=DEADLINE * 2)
        assert sorted(runs) == sorted(ticks)
        for tick in ticks:
            assert await worker.processed.state(tick) == DONE  # type: ignore[union-attr]
        await wait_for_async(lambda: _no_marker(nc, "slow"), timeout=DEADLINE)
        assert worker.stats.takeovers == 0 and worker.stats.lease_lost == 0
    finally:
        await worker.stop()
        await slow.close()
        proxy.close()


async def _no_marker(nc: Client, job: str) -> bool:
    return await marker(nc, job) is None


# --- 5. overlapping runs of one job -------------------------------------------------------------


async def test_a_short_run_does_not_clear_the_marker_of_a_long_one(nc: Client) -> None:
    release = asyncio.Event()
    started: list[str] = []

    async def handler(trigger: Trigger) -> None:
        started.append(trigger.tick)
        if trigger.tick.endswith(":1000"):
            await release.wait()

    # A slow heartbeat: the long run does not rewrite its marker during the test.
    worker = Worker(nc, handler, durable="overlap2", ack_wait=30.0, heartbeat=10.0, concurrency=2)
    await worker.start()
    runs = JetStreamRuns(await nc.jetstream().key_value("hrwcron_runs"))
    try:
        long = await publish(nc, "overlap2", 1_000)
        await wait_for_async(lambda: started == [long], timeout=DEADLINE)
        # A manual trigger of the same job, which the scheduler does not skip.
        await publish(nc, "overlap2", 2_000)
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
        assert await runs.running("overlap2"), "the long run's marker is gone"
        assert (await marker(nc, "overlap2") or {}).get("tick") == long
        release.set()
        await wait_for_async(lambda: worker.stats.handled == 2, timeout=DEADLINE)
        assert not await runs.running("overlap2")
    finally:
        release.set()
        await worker.stop()


# --- 6. tombstones ------------------------------------------------------------------------------


async def test_a_deleted_or_purged_record_lets_the_tick_run_again(nc: Client) -> None:
    js = nc.jetstream()
    processed = await Processed.open(js, namespace="rerun")
    ticks = ["rerun:1000", "rerun:2000"]
    for tick in ticks:
        state, rev = await processed.begin(tick, "earlier-run")
        assert state == "run" and await processed.finish(tick, "earlier-run", rev)
    kv = await js.key_value("hrwcron_processed")
    await kv.delete(processed.key(ticks[0]))  # an operator's `nats kv del`
    await kv.purge(processed.key(ticks[1]))  # and `nats kv purge`

    runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        runs.append(trigger.tick)

    worker = Worker(nc, handler, durable="rerun", ack_wait=1.0, heartbeat=0.3, max_deliver=3)
    await worker.start()
    try:
        for due in (1_000, 2_000):
            await publish(nc, "rerun", due)
        await wait_for_async(lambda: worker.stats.handled == 2, timeout=DEADLINE)
        assert sorted(runs) == ticks
        for tick in ticks:
            assert await processed.state(tick) == DONE
    finally:
        await worker.stop()


# --- 7. and 8. consumer settings ----------------------------------------------------------------


async def _consumer(nc: Client, durable: str, **config: object) -> None:
    await nc.jetstream().add_consumer(
        STREAM,
        ConsumerConfig(
            durable_name=durable,
            ack_policy=AckPolicy.EXPLICIT,
            filter_subject=f"hrwcron.trigger.{durable}",
            **config,  # type: ignore[arg-type]
        ),
    )


async def test_an_existing_consumer_the_heartbeat_cannot_keep_is_refused(nc: Client) -> None:
    await _consumer(nc, "shortwait", ack_wait=1.0)

    async def handler(trigger: Trigger) -> None:
        return None

    worker = Worker(
        nc,
        handler,
        durable="shortwait",
        subjects="hrwcron.trigger.shortwait",
        ack_wait=5.0,
        heartbeat=2.0,
    )
    try:
        with pytest.raises(HrwcronError, match=r"ack_wait .*1 s.*heartbeat.*2 s") as refused:
            await worker.start()
    finally:
        await worker.stop()
    assert isinstance(refused.value, sdk.WorkerSetupError)
    info = await nc.jetstream().consumer_info(STREAM, "shortwait")
    assert info.config.ack_wait == 1.0  # left as it was


async def test_an_existing_consumers_max_deliver_is_the_one_used(
    nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    await _consumer(nc, "fewtries", ack_wait=5.0, max_deliver=2)
    deliveries: list[int] = []

    async def broken(trigger: Trigger) -> None:
        deliveries.append(trigger.delivered)
        raise RuntimeError("down")

    worker = Worker(
        nc,
        broken,
        durable="fewtries",
        subjects="hrwcron.trigger.fewtries",
        max_deliver=5,
        backoff=[0.2],
        heartbeat=0.5,
    )
    await worker.start()
    try:
        tick = await publish(nc, "fewtries", 1_000)
        await wait_for_async(
            lambda: logged(caplog, tick, "giving up"), timeout=DEADLINE, message="given up"
        )
        assert deliveries == [1, 2]
        assert worker.stats.given_up == 1 and worker.max_deliver == 2
    finally:
        await worker.stop()


async def test_unlimited_max_deliver_retries(nc: Client) -> None:
    deliveries: list[int] = []

    async def flaky(trigger: Trigger) -> None:
        deliveries.append(trigger.delivered)
        if trigger.delivered < 3:
            raise RuntimeError("not yet")

    worker = Worker(nc, flaky, durable="forever", max_deliver=-1, backoff=[0.2], heartbeat=0.5)
    await worker.start()
    try:
        await publish(nc, "forever", 1_000)
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
        assert deliveries == [1, 2, 3]
        info = await nc.jetstream().consumer_info(STREAM, "forever")
        assert info.config.max_deliver == -1
    finally:
        await worker.stop()


# --- 9. graceful stop ---------------------------------------------------------------------------


async def test_a_graceful_stop_takes_no_trigger_it_does_not_process(
    nc: Client, nats_url: str
) -> None:
    release = asyncio.Event()
    runs: list[tuple[str, int, str]] = []

    def handler_of(name: str):  # type: ignore[no-untyped-def]
        async def handler(trigger: Trigger) -> None:
            runs.append((trigger.tick, trigger.delivered, name))
            if trigger.tick.endswith(":1000"):
                await release.wait()

        return handler

    # The default ack_wait (30 s) is longer than every deadline below: a trigger the stopping
    # worker took and dropped would not come back in time.
    first = Worker(nc, handler_of("first"), durable="graceful", concurrency=2, heartbeat=0.5)
    await first.start()
    await publish(nc, "graceful", 1_000)
    await wait_for_async(lambda: len(runs) == 1, timeout=DEADLINE)
    stopping = asyncio.create_task(first.stop(timeout=30))
    # The first worker is stopping and waits for its running handler; its pull is still open.
    await wait_for_async(lambda: first.stopping, timeout=DEADLINE)
    late = await publish(nc, "graceful", 2_000)
    release.set()
    await stopping

    other = await nats.connect(nats_url)
    second = Worker(other, handler_of("second"), durable="graceful", heartbeat=0.5)
    await second.start()
    try:
        await wait_for_async(
            lambda: any(tick == late for tick, _, _ in runs),
            timeout=DEADLINE,
            message="the trigger published during the stop runs promptly",
        )
        assert [(d) for tick, d, _ in runs if tick == late] == [1]
        await wait_for_async(lambda: settled(nc, "graceful"), timeout=DEADLINE)
    finally:
        await second.stop()
        await other.close()


# --- 10. kill -9 between the handler's return and the done record ---------------------------


async def test_a_worker_killed_before_its_done_record_is_the_counted_second_run(
    nc: Client, nats_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runs_file = tmp_path / "runs.jsonl"
    child = worker_process(
        nats_url,
        runs_file,
        "doomed",
        log_path=tmp_path / "doomed.log",
        env={FAILPOINTS: "worker_handler_returned=crash"},
        options=[
            "--durable",
            "killed",
            "--subjects",
            "hrwcron.trigger.killed",
            "--ack-wait",
            "1",
            "--heartbeat",
            "0.3",
            "--work-min",
            "0",
            "--work-max",
            "0",
        ],
    )
    try:
        await asyncio.to_thread(child.wait_for_log, "worker doomed ready", 30)
        tick = await publish(nc, "killed", 1_000)
        await asyncio.to_thread(child.wait, 30)
        assert child.returncode == 137
        assert [(e.event, e.tick) for e in read_runs(runs_file)] == [("start", tick), ("end", tick)]

        runs: list[Trigger] = []

        async def handler(trigger: Trigger) -> None:
            runs.append(trigger)

        worker = Worker(
            nc,
            handler,
            durable="killed",
            subjects="hrwcron.trigger.killed",
            ack_wait=1.0,
            heartbeat=0.3,
        )
        await worker.start()
        try:
            await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
            assert [(t.tick, t.takeover) for t in runs] == [(tick, True)]
            assert worker.stats.takeovers == 1
            assert logged(caplog, tick, "taking over")
        finally:
            await worker.stop()
    finally:
        child.kill()


# --- a handler that blocks the event loop -------------------------------------------------------


async def test_a_handler_blocking_the_loop_is_reported(
    nc: Client, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "hrwcron.worker")

    async def blocking(trigger: Trigger) -> None:
        time.sleep(1.0)  # noqa: ASYNC251 - the fault under test: a call that blocks the loop

    worker = Worker(nc, blocking, durable="blocking", ack_wait=3.0, heartbeat=0.25)
    await worker.start()
    try:
        tick = await publish(nc, "blocking", 1_000)
        await wait_for_async(lambda: worker.stats.handled == 1, timeout=DEADLINE)
        assert worker.stats.loop_stalls >= 1
        assert logged(caplog, tick, "event loop")
    finally:
        await worker.stop()
