"""The shipped nats-server configurations: each one parses, and on a real 3-node cluster started
from them each role can do its job and nothing more."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import nats
import pytest
from nats.errors import Error as NatsError
from nats.js.api import ConsumerConfig, DeliverPolicy

from harness import nats_server_binary, wait_for_async
from hrwcron.admin.client import AdminClient, AdminError
from hrwcron.cli.provision import worker_consumer
from hrwcron.core.config import parse_config
from hrwcron.core.model import ClaimRecord
from hrwcron.core.ticks import manual_claim_key
from hrwcron.process.app import Replica, open_stores, start_replica
from hrwcron.worker import Trigger, Worker

from .natsconf import (
    CONFIG_FILES,
    NATS_DIR,
    NODE_FILES,
    WORKER_API_PREFIX,
    Session,
    ShippedCluster,
    passwords_env,
    random_passwords,
)

STREAM = "HRWCRON_TRIGGERS"
JOB = "deploy.tick"
SUBJECT = f"hrwcron.trigger.{JOB}"
REPLICA_NAME = "deploy-replica"


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(NATS_DIR)))
def test_config_passes_nats_server_check(path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", **passwords_env(random_passwords())}
    done = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert "is valid" in done.stderr + done.stdout


def test_config_without_passwords_is_refused() -> None:
    # Secrets come only from the environment: a missing one must stop the server, not
    # silently leave a role without a password.
    done = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(NATS_DIR / "single.conf")],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "NATS_SCHEDULER_PASSWORD" in done.stderr + done.stdout


def test_cluster_node_files_differ_only_in_their_name() -> None:
    def shape(path: Path) -> list[str]:
        lines = path.read_text().splitlines()
        return [line for line in lines[1:] if not line.startswith("server_name:")]

    names = [re.search(r"(?m)^server_name: (\S+)$", p.read_text()) for p in NODE_FILES]
    assert [m.group(1) if m else None for m in names] == ["nats-1", "nats-2", "nats-3"]
    assert shape(NODE_FILES[0]) == shape(NODE_FILES[1]) == shape(NODE_FILES[2])


def test_every_permission_line_is_commented() -> None:
    # Each quoted subject sits under a comment in its own block, so a reader learns why it is
    # granted; a subject appended without one fails here.
    lines = (NATS_DIR / "accounts.conf").read_text().splitlines()
    for i, line in enumerate(lines):
        if line.strip().startswith('"'):
            block = lines[:i]
            while block and block[-1].strip().startswith('"'):
                block.pop()
            above = block[-1].strip() if block else ""
            assert above.startswith("#"), f"line {i + 1} ({line.strip()}) has no comment"


# --- a real cluster from the shipped files --------------------------------------------------


def replica_config(urls: list[str], password: str, node: str) -> str:
    return f"""
[nats]
servers = {urls!r}
name = "{REPLICA_NAME}"
user = "scheduler"
password = "{password}"

[scheduler]
node_id = "{node}"
replicas = 3

[http]
listen = ""

[[jobs]]
name = "{JOB}"
schedule = "@every 1s"
"""


def _refused(cluster: ShippedCluster, connection: str) -> list[str]:
    """Refused publishes and subscriptions the servers logged for a connection name."""
    return [
        f"{name}: {line}"
        for name, text in cluster.logs()
        for line in text.splitlines()
        if "Violation" in line and f":{connection}" in line
    ]


async def test_each_role_does_its_job(
    shipped_cluster: ShippedCluster, passwords: dict[str, str], sessions: dict[str, Session]
) -> None:
    """A real replica as `scheduler`, the worker SDK as `worker`, the admin client as `admin`:
    triggers flow end to end and no server refuses anything."""
    config = parse_config(
        replica_config(shipped_cluster.urls, passwords["scheduler"], "deploy-a"), "test", {}
    )
    handled: list[str] = []

    async def handle(trigger: Trigger) -> None:
        handled.append(trigger.tick)

    # A missing permission shows up as a claim, publish or reply that never comes: bound the
    # whole exchange so it fails instead of hanging.
    async with asyncio.timeout(180):
        replica: Replica = await start_replica(config, {})
        # Workers may not create consumers: the operator does, with the scheduler role.
        line = await worker_consumer(
            replica.stores.client.jetstream(), STREAM, "deploy-workers", [SUBJECT]
        )
        assert line.startswith(f"consumer {STREAM}/deploy-workers: ")
        worker = Worker(
            sessions["worker"].client,
            handle,
            durable="deploy-workers",
            subjects=SUBJECT,
            api_prefix=WORKER_API_PREFIX,
        )
        try:
            await worker.start()
            await wait_for_async(
                lambda: len(handled) >= 2, timeout=60, message="the worker ran two ticks"
            )
            assert worker.processed is not None
            assert await worker.processed.state(handled[0]) == "done"

            admin = AdminClient(sessions["admin"].client)
            # The service may have subscribed through another node than the admin's; its
            # interest reaches the admin's node over the routes a moment later.
            status = await wait_for_async(
                admin.status, timeout=30, message="the admin API answers", ignore=(AdminError,)
            )
            assert status.node == "deploy-a"
            assert JOB in [job.name for job in (await admin.list_jobs()).jobs]
            manual = await admin.trigger(JOB, "deploy-check")
            assert manual.outcome == "started"
            history = await admin.history(JOB, limit=5)
            assert history.triggers
            # A manual trigger that was not published gives its claim back (a rare path, so
            # taken by hand here): the retry can take it again.
            claims, key = replica.stores.claims, manual_claim_key(JOB, "release-check")
            record = ClaimRecord(node="deploy-a", instance="i", attempt=1, claimed_ms=0)
            revision = await claims.create(key, record, 60)
            assert revision is not None and await claims.release(key, revision)
            assert await claims.create(key, record, 60) is not None
            ping = await sessions["admin"].client.request("$SRV.PING.hrwcron", b"", timeout=5)
            assert json.loads(ping.data)["name"] == "hrwcron"
        finally:
            await asyncio.wait_for(worker.stop(), timeout=30)
            await asyncio.wait_for(replica.stop(), timeout=30)
    assert sessions["worker"].violations() == []
    assert sessions["admin"].violations() == []
    assert _refused(shipped_cluster, REPLICA_NAME) == []


async def test_provision_with_scheduler_role(
    shipped_cluster: ShippedCluster, passwords: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "hrwcron.toml"
    path.write_text(replica_config(shipped_cluster.urls, passwords["scheduler"], "provisioner"))
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "hrwcron", "provision", "--config", str(path), "--timeout", "60"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        "bucket hrwcron_members",
        "bucket hrwcron_claims",
        "bucket hrwcron_jobs",
        "bucket hrwcron_runs",
        "bucket hrwcron_counts",
        "bucket hrwcron_processed",
        f"stream {STREAM}",
    ]
    assert all("replicas 3" in line for line in lines), lines


async def test_worker_cannot_fire_or_claim(
    shipped_cluster: ShippedCluster, passwords: dict[str, str], sessions: dict[str, Session]
) -> None:
    worker, scheduler = sessions["worker"], sessions["scheduler"]
    # Provisioned with the scheduler role, so the stream and buckets exist whatever ran before.
    config = parse_config(
        replica_config(shipped_cluster.urls, passwords["scheduler"], "unused"), "test", {}
    )
    stores = await open_stores(config)
    try:
        forged = f"hrwcron.trigger.{JOB}.forged"
        for subject in (
            forged,
            "$KV.hrwcron_claims.forged.1",
            "$KV.hrwcron_members.forged",
            "$KV.hrwcron_jobs.forged",
            "$KV.hrwcron_counts.forged",
            f"$JS.API.STREAM.PURGE.{STREAM}",
            "$JS.API.STREAM.DELETE.KV_hrwcron_claims",
        ):
            error = await worker.denied(subject)
            assert "permissions violation" in error.lower()
        # Through the JetStream API the request is dropped, so the call fails, not lands.
        with pytest.raises(NatsError):
            await worker.client.jetstream().publish(forged, b"{}", timeout=2)
        # A consumer could name a claim key as its push delivery subject, which the server
        # would write inside the scheduler's account: workers cannot create consumers at all,
        # under the imported API or the account's own.
        for prefix in (WORKER_API_PREFIX, "$JS.API"):
            with pytest.raises(NatsError):
                await worker.client.jetstream(prefix=prefix).add_consumer(
                    STREAM,
                    ConsumerConfig(
                        durable_name="deploy-push-probe",
                        deliver_subject="$KV.hrwcron_claims.forged.2",
                        deliver_policy=DeliverPolicy.ALL,
                    ),
                    timeout=2,
                )
        # Nothing reached the stream or the bucket.
        assert await stores.triggers.last(forged) is None
        assert await stores.claims.get("forged.1") is None
        assert await stores.claims.get("forged.2") is None
    finally:
        await stores.client.close()
    assert scheduler.violations() == []


async def test_admin_cannot_touch_jetstream(sessions: dict[str, Session]) -> None:
    admin = sessions["admin"]
    for subject in (SUBJECT, "$KV.hrwcron_jobs.x", f"$JS.API.STREAM.INFO.{STREAM}"):
        await admin.denied(subject)


async def test_scheduler_cannot_touch_what_is_not_its_own(sessions: dict[str, Session]) -> None:
    scheduler = sessions["scheduler"]
    for subject in (
        f"$JS.API.STREAM.DELETE.{STREAM}",
        f"$JS.API.STREAM.PURGE.{STREAM}",
        "$JS.API.STREAM.DELETE.KV_hrwcron_claims",
        "$KV.hrwcron_processed.x",
        "other.subject",
        # allow_responses lets it answer requests, not publish on anyone's inbox at will.
        "_INBOX.unsolicited",
    ):
        await scheduler.denied(subject)


async def test_anonymous_clients_are_refused(shipped_cluster: ShippedCluster) -> None:
    with pytest.raises(NatsError, match="Authorization Violation"):
        await nats.connect(
            servers=shipped_cluster.urls[:1], allow_reconnect=False, connect_timeout=5
        )


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: str(p.relative_to(NATS_DIR)))
def test_config_flushes_jetstream_writes_before_acknowledging(path: Path) -> None:
    # Without it a power cut loses what the server acknowledged in the last two minutes.
    block = re.search(r"(?ms)^jetstream \{\n(.*?)^\}", path.read_text())
    assert block is not None, f"{path.name} has no jetstream block"
    assert re.search(r"(?m)^\s*sync_interval: always$", block.group(1))


def test_shipped_cluster_runs_with_sync_always(shipped_cluster: ShippedCluster) -> None:
    for server in shipped_cluster.servers:
        assert server.varz()["jetstream"]["config"].get("sync_always") is True, server.name


def test_helm_values_flush_before_acknowledging() -> None:
    readme = (NATS_DIR.parent / "deploy" / "kubernetes" / "README.md").read_text()
    values = re.search(r"(?ms)^# nats-values\.yaml\n(.*?)^```", readme)
    assert values is not None
    import yaml

    config = yaml.safe_load(values.group(1))["config"]["jetstream"]
    assert config["merge"] == {"sync_interval": "always"}
