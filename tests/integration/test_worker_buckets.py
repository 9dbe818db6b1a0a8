"""Buckets the worker SDK creates are as replicated as the trigger stream, and `hrwcron
provision` creates them too and reports one that is not, on a real 3-node cluster."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import nats
import pytest
from nats.errors import Error as NatsError
from nats.js.api import KeyValueConfig, StorageType, StreamConfig

from harness import NatsCluster, wait_for_async
from hrwcron.worker import Trigger, Worker

STREAM = "HRWCRON_TRIGGERS"


def provision(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hrwcron", "provision", "--timeout", "60"],
        env={
            "PATH": "/usr/bin:/bin",
            "HRWCRON_NATS_URL": url,
            "HRWCRON_SCHEDULER_REPLICAS": "3",
        },
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.cluster
async def test_worker_buckets_follow_the_stream_and_provision_checks_them(
    nats_cluster: NatsCluster,
) -> None:
    nc = await nats.connect(nats_cluster.urls)
    try:
        js = nc.jetstream()
        # Only the stream exists, as when workers start before any replica.
        await js.add_stream(
            StreamConfig(
                name=STREAM,
                subjects=["hrwcron.trigger.>"],
                num_replicas=3,
                max_age=86_400,
                duplicate_window=600,
            )
        )

        async def handler(trigger: Trigger) -> None:
            return None

        worker = Worker(nc, handler, durable="replicated", heartbeat=0.5)
        # A just-created replicated stream answers once it has elected a leader.
        await wait_for_async(
            lambda: _started(worker), timeout=60, interval=0.5, ignore=(NatsError, TimeoutError)
        )
        await worker.stop()
        for bucket, storage in (
            ("hrwcron_processed", StorageType.FILE),
            ("hrwcron_runs", StorageType.MEMORY),
        ):
            info = await js.stream_info(f"KV_{bucket}")
            assert (info.config.num_replicas, info.config.storage) == (3, storage), bucket
        processed = await js.stream_info("KV_hrwcron_processed")
        assert processed.config.max_age == 86_400  # no record outlives the stream's triggers

        done = await asyncio.to_thread(provision, nats_cluster.urls[0])
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert "bucket hrwcron_processed: exists (file storage, replicas 3, max age 24h)" in lines
        assert "bucket hrwcron_runs: exists (memory storage, replicas 3, max age 30s)" in lines

        # A single-replica bucket, as workers before this change created it.
        await js.delete_stream("KV_hrwcron_processed")
        await js.create_key_value(config=KeyValueConfig(bucket="hrwcron_processed", replicas=1))
        done = await asyncio.to_thread(provision, nats_cluster.urls[0])
        assert done.returncode == 1
        assert "bucket hrwcron_processed has 1 replica(s), scheduler.replicas is 3" in done.stderr
        info = await js.stream_info("KV_hrwcron_processed")
        assert info.config.num_replicas == 1  # reported, not changed
    finally:
        await nc.close()


async def _started(worker: Worker) -> bool:
    await worker.start()
    return True
