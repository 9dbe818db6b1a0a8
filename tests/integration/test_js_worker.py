"""The JavaScript worker (examples/js-worker) run with ``node`` against real replicas on a real
nats-server: every tick the stream holds runs exactly once, through acks it drops on purpose
(JetStream redelivers, the done record keeps the tick from running again), handler failures
(released and retried), two workers sharing the durable, and a Python SDK worker sharing it
too; every body and header set it received conforms to docs/triggers.md and its schema.

Skipped, saying why, where ``node`` or the example's npm packages are missing (``make test``
installs them with ``npm ci`` where npm exists)."""

from __future__ import annotations

import asyncio
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_binary_event

from harness import ReplicaProcess, wait_for_async
from harness.inprocess_replicas import Cluster
from harness.trigger_contract import ROOT, check_trigger
from harness.worker_records import settled
from hrwcron.core.model import JobSpec
from hrwcron.worker import Trigger, Worker

EXAMPLE = ROOT / "examples" / "js-worker"
NODE = shutil.which("node")
DEADLINE = 60.0
DURABLE = "js-group"
SUBJECT = "hrwcron.trigger.js.>"
JOBS = ("js.every", "js.slower")

if NODE is None:
    pytest.skip(
        "node is not installed (Debian: apt-get install nodejs npm); the JavaScript worker "
        "example cannot run",
        allow_module_level=True,
    )
if not (EXAMPLE / "node_modules" / "@nats-io" / "jetstream").is_dir():
    pytest.skip(
        "the JavaScript worker's npm packages are not installed: make js-worker "
        "(npm ci --prefix examples/js-worker)",
        allow_module_level=True,
    )


class NodeWorker(ReplicaProcess):
    """``node examples/js-worker/worker.js ...`` in its own process group, output in a log."""

    @property
    def argv(self) -> list[str]:
        assert NODE is not None
        return [NODE, str(EXAMPLE / "worker.js"), *self.args]


async def start_worker(url: str, tmp_path: Path, name: str, *flags: str) -> tuple[NodeWorker, Path]:
    out = tmp_path / f"{name}.jsonl"
    args = ["--server", url, "--durable", DURABLE, "--subject", SUBJECT, "--out", str(out)]
    # A short ack_wait so a dropped ack is redelivered within the test; the heartbeat must
    # be at most half of it.
    args += ["--ack-wait", "2", "--heartbeat", "0.5", *flags]
    worker = NodeWorker(args, log_path=tmp_path / f"{name}.log")
    # In a thread: the replicas run on this event loop and must keep heartbeating.
    await asyncio.to_thread(worker.wait_for_log, r"^worker .* consuming ", DEADLINE)
    return worker, out


def runs_in(path: Path) -> list[dict[str, Any]]:
    """The completed runs a worker recorded, one JSON line each (a line still being written
    is left for the next read)."""
    if not path.exists():
        return []
    text = path.read_text()
    return [json.loads(line) for line in text.split("\n")[:-1] if line]


async def stored_ticks(cluster: Cluster) -> list[str]:
    return [r.msg_id for job in JOBS for r in await cluster.stored(job)]


async def wait_all_ran(cluster: Cluster, ran: Any) -> None:
    """Until every trigger the stream holds has run and every delivery is acked: a publish
    in flight when the pause landed may still arrive, and a dropped ack is redelivered only
    after ack_wait. ``ran`` gives the tick keys run so far."""

    async def done() -> bool:
        return set(ran()) == set(await stored_ticks(cluster)) and await settled(
            cluster.client, DURABLE
        )

    await wait_for_async(done, timeout=DEADLINE, interval=0.2, message="every tick ran, acked")


async def stop_firing(cluster: Cluster) -> None:
    """Pause the jobs and wait until every replica knows, so the stream stops growing."""
    for job in JOBS:
        await cluster.admin.pause(job)
    await wait_for_async(
        lambda: all(
            r.scheduler.jobs[job].spec.paused for r in cluster.replicas.values() for job in JOBS
        ),
        timeout=DEADLINE,
        message="every replica saw the pauses",
    )


def check_received(run: dict[str, Any]) -> None:
    """One run's trigger, as the JavaScript client handed it over, against the contract: the
    body against the schema, the headers against the body, the CloudEvent against both."""
    headers: dict[str, str] = run["headers"]
    body = check_trigger(run["body"], headers)
    assert run["tick"] == body["tick"]
    event = from_binary_event(HTTPMessage(headers=headers, body=run["body"].encode()))
    assert (event.get_id(), event.get_subject()) == (body["tick"], body["job"])
    assert event.get_type() == "io.hrwcron.tick"
    assert event.get_data() == body


async def start_fleet(url: str) -> Cluster:
    cloudevents = {"cloudevents": True}
    cluster = await Cluster.start(url, {"a": cloudevents, "b": cloudevents})
    return cluster


async def fire(cluster: Cluster) -> str:
    await cluster.admin.put_job(
        JobSpec(name="js.every", schedule="@every 1s", payload={"lang": "js", "n": [1, 2]})
    )
    await cluster.admin.put_job(JobSpec(name="js.slower", schedule="@every 2s"))
    return (await cluster.admin.trigger("js.every", "from-test")).tick


@pytest.mark.timeout(180)  # two node processes, redeliveries after ack_wait and retries
async def test_two_js_workers_run_every_tick_once_through_dropped_acks_and_failures(
    nats_url: str, tmp_path: Path
) -> None:
    cluster = await start_fleet(nats_url)
    first, second = None, None
    try:
        first, first_out = await start_worker(nats_url, tmp_path, "first", "--drop-ack-every", "2")
        second, second_out = await start_worker(nats_url, tmp_path, "second", "--fail-every", "3")
        manual = await fire(cluster)

        def exercised() -> bool:
            ran = [r["tick"] for r in runs_in(first_out) + runs_in(second_out)]
            logs = first.output() + second.output()
            return (
                len(ran) >= 10
                and manual in ran
                and "acked without running" in logs  # a dropped ack's redelivery
                and "retry in" in logs  # a failed run handed back
                and all(runs_in(out) for out in (first_out, second_out))
            )

        await wait_for_async(exercised, timeout=DEADLINE, interval=0.2, message="faults seen")
        await stop_firing(cluster)
        await wait_all_ran(
            cluster, lambda: [r["tick"] for r in runs_in(first_out) + runs_in(second_out)]
        )
        for worker in (first, second):
            status = await asyncio.to_thread(worker.terminate, 15.0)
            assert status.returncode == 0, worker.output()
            assert "stopped: handled" in worker.output()
        runs = runs_in(first_out) + runs_in(second_out)
        ran = Counter(run["tick"] for run in runs)
        assert [tick for tick, n in ran.items() if n > 1] == []
        assert sorted(ran) == sorted(await stored_ticks(cluster))
        for run in runs:
            check_received(run)
        # The retry of a failed run is a later delivery of the same trigger.
        assert any(run["delivered"] > 1 for run in runs)
    finally:
        for worker in (first, second):
            if worker is not None and worker.running:
                worker.kill()
        await cluster.stop()


@pytest.mark.timeout(180)
async def test_a_js_worker_and_a_python_worker_share_a_durable_and_run_each_tick_once(
    nats_url: str, tmp_path: Path
) -> None:
    cluster = await start_fleet(nats_url)
    python_runs: list[str] = []

    async def handler(trigger: Trigger) -> None:
        python_runs.append(trigger.tick)

    node = None
    python = Worker(
        cluster.client,
        handler,
        durable=DURABLE,
        subjects=SUBJECT,
        ack_wait=2.0,
        heartbeat=0.5,
        run_markers=False,
    )
    try:
        node, node_out = await start_worker(nats_url, tmp_path, "node", "--drop-ack-every", "2")
        await python.start()
        await fire(cluster)

        def both_ran() -> bool:
            js_runs = runs_in(node_out)
            logs = node.output()
            return (
                len(js_runs) + len(python_runs) >= 10
                and len(js_runs) >= 2
                and len(python_runs) >= 2
                and "dropping the ack" in logs
            )

        await wait_for_async(both_ran, timeout=DEADLINE, interval=0.2, message="both ran ticks")
        await stop_firing(cluster)
        await wait_all_ran(cluster, lambda: [r["tick"] for r in runs_in(node_out)] + python_runs)
        status = await asyncio.to_thread(node.terminate, 15.0)
        assert status.returncode == 0, node.output()
        js_runs = runs_in(node_out)
        ran = Counter([run["tick"] for run in js_runs] + python_runs)
        assert [tick for tick, n in ran.items() if n > 1] == []
        assert sorted(ran) == sorted(await stored_ticks(cluster))
        for run in js_runs:
            check_received(run)
        # A dropped JavaScript ack redelivered to either worker found the done record.
        dropped = node.output().count("dropping the ack")
        assert dropped >= 1
        assert python.stats.duplicates + node.output().count("acked without running") >= dropped
    finally:
        await python.stop()
        if node is not None and node.running:
            node.kill()
        await cluster.stop()
