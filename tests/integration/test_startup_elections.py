"""A replica's start-up rides out a JetStream election on a real 3-node cluster, and ends at
once, in one line, on what no retry can change (refused credentials, refused permissions).
The bound itself (JetStream never serving) is in ``test_stopping.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from harness import NatsCluster, NatsServer
from harness.commands import replica
from hrwcron.core.config import load_config
from hrwcron.process.app import open_stores

DEADLINE = 90.0
NOT_SERVING = "start-up: JetStream is not serving yet"
R3 = {"HRWCRON_SCHEDULER_REPLICAS": "3"}


async def provision_r3(cluster: NatsCluster) -> None:
    """Buckets and stream at three replicas, as the replicas below expect them."""
    config = load_config(None, {"HRWCRON_NATS_URL": cluster.url, **R3})
    stores = await open_stores(config)
    await stores.client.close()


@pytest.mark.cluster
async def test_a_replica_started_without_a_quorum_starts_once_there_is_one(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    await provision_r3(nats_cluster)
    # Two of three nodes frozen: no stream, bucket or meta leader can be elected until one is
    # back. (Frozen, not killed: a memory-storage stream whose majority restarted empty elects
    # no leader again, which is JetStream's limit, not the election this test is about.)
    for i in (1, 2):
        nats_cluster.servers[i].pause()
    proc = replica(nats_cluster.url, "patient", tmp_path / "patient.log", **R3)
    with proc:
        proc.wait_for_log(NOT_SERVING, DEADLINE)
        nats_cluster.servers[1].resume()
        started = proc.wait_for_log(r"replica patient started", DEADLINE)
        output = proc.output()
        assert proc.running
        assert output.count(NOT_SERVING) == 1, output[-3000:]  # logged once
        summary = proc.wait_for_log(r"JetStream served after (\d+) attempts in", 5)
        assert int(summary.group(1)) >= 2
        assert summary.start() > started.start()  # the summary closes the start
        assert "could not start" not in output and "Traceback" not in output


@pytest.mark.cluster
async def test_a_replica_started_right_after_the_stream_leader_is_killed_starts(
    nats_cluster: NatsCluster, tmp_path: Path
) -> None:
    await provision_r3(nats_cluster)
    leader = await asyncio.to_thread(nats_cluster.wait_stream_leader, "KV_hrwcron_members")
    await asyncio.to_thread(nats_cluster.kill, leader)
    proc = replica(nats_cluster.url, "eager", tmp_path / "eager.log", **R3)
    with proc:
        proc.wait_for_log(r"replica eager started", DEADLINE)
        output = proc.output()
        assert proc.running
        assert "could not start" not in output and "Traceback" not in output
        if NOT_SERVING in output:  # the election was still on when it asked
            assert "JetStream served after" in output, output[-3000:]


def test_refused_credentials_end_the_start_at_once_in_one_line(tmp_path: Path) -> None:
    users = 'authorization { users: [{user: "s", password: "right"}] }\n'
    server = NatsServer(config_text=users, base_dir=tmp_path / "n").start()
    try:
        proc = replica(f"nats://s:wrong@127.0.0.1:{server.port}", "badpw", tmp_path / "r.log")
        with proc:
            assert proc.wait(20) == 1, proc.output()[-2000:]
        output = proc.output()
        errors = [line for line in output.splitlines() if " ERROR " in line]
        assert len(errors) == 1, output[-2000:]
        assert "could not start: NATS at" in errors[0]
        assert "refused this replica's credentials" in errors[0]
        assert "wrong" not in errors[0]  # the password is not quoted
        assert NOT_SERVING not in output and "Traceback" not in output
    finally:
        server.cleanup()


def test_a_request_refused_for_want_of_permission_ends_the_start_at_once(
    tmp_path: Path,
) -> None:
    # The server refuses the JetStream API to this user: each request gets an error on the
    # connection and no answer, which looks like a timeout unless the refusal is heard.
    users = (
        'authorization { users: [{user: "s", password: "p", '
        'permissions: {publish: {deny: ["$JS.API.>"]}}}] }\n'
    )
    server = NatsServer(config_text=users, base_dir=tmp_path / "n").start()
    try:
        proc = replica(f"nats://s:p@127.0.0.1:{server.port}", "denied", tmp_path / "r.log")
        with proc:
            assert proc.wait(30) == 1, proc.output()[-2000:]
        output = proc.output()
        errors = [line for line in output.splitlines() if " ERROR " in line]
        assert len(errors) == 1, output[-2000:]
        assert "NATS refused a request of this replica" in errors[0]
        # nats-py hands on the server's words lowercased.
        assert 'permissions violation for publish to "$js.api.' in errors[0], errors[0]
        assert NOT_SERVING not in output and "Traceback" not in output
    finally:
        server.cleanup()
