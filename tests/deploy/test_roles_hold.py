"""Roles hold on the shipped accounts: each attack a worker or an admin user could try, against a
real replica on the 3-node cluster started from nats/, fails and leaves the jobs, members,
claims and trigger stream as they were.

Every attack here worked when all three roles shared one account: JetStream answers a request
on the reply subject the requester chose, and inside one account that can be a bucket key or a
trigger subject. Each test proves both halves: the attacker's request reached the server (it
got an answer, or the server logged nothing refused), and nothing landed where it aimed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import nats
import nats.aio.msg
import pytest
from nats.errors import Error as NatsError
from nats.js.api import RePublish, StreamConfig
from nats.js.errors import NotFoundError

from harness import wait_for_async
from hrwcron.core import partitions
from hrwcron.core.config import parse_config
from hrwcron.core.model import Heartbeat
from hrwcron.core.ticks import TickId
from hrwcron.engine.marks import Mark
from hrwcron.process.app import Replica, start_replica

from .natsconf import WORKER_API_PREFIX, Session, ShippedCluster

NODE = "roles-r1"
VICTIM = "roles.victim"
VICTIM_SUBJECT = f"hrwcron.trigger.{VICTIM}"
STREAM = "HRWCRON_TRIGGERS"


def config_text(urls: list[str], password: str) -> str:
    return f"""
[nats]
servers = {urls!r}
name = "roles-replica"
user = "scheduler"
password = "{password}"

[scheduler]
node_id = "{NODE}"
replicas = 3

[http]
listen = ""

[[jobs]]
name = "{VICTIM}"
schedule = "@every 1s"
"""


@pytest.fixture
async def replica(
    shipped_cluster: ShippedCluster, passwords: dict[str, str]
) -> AsyncIterator[Replica]:
    config = parse_config(config_text(shipped_cluster.urls, passwords["scheduler"]), "test", {})
    running = await asyncio.wait_for(start_replica(config, {}), 120)
    try:
        # The victim job fires, so its trigger subject has a last message to compare with.
        await wait_for_async(
            lambda: running.scheduler.last.get(VICTIM_SUBJECT) is not None,
            timeout=60,
            message="the victim job fired once",
        )
        yield running
    finally:
        await asyncio.wait_for(running.stop(), 30)


async def _last(replica: Replica, subject: str) -> tuple[int, bytes] | None:
    js = replica.stores.client.jetstream()
    stream = STREAM if subject.startswith("hrwcron.trigger.") else f"KV_{subject.split('.')[1]}"
    try:
        msg = await js.get_last_msg(stream, subject)
    except NotFoundError:
        return None
    return msg.seq, msg.data or b""


def _targets(replica: Replica) -> list[str]:
    """Subjects an attacker would aim a reply at: this replica's members key, the victim's
    job key, the claim keys of its next ticks, and a trigger subject."""
    job = replica.scheduler.jobs[VICTIM]
    due = job.due or 0
    claims = [f"$KV.hrwcron_claims.{TickId(VICTIM, due + i * 1000).claim_key}" for i in range(2, 5)]
    return [
        f"$KV.hrwcron_members.{NODE}",
        f"$KV.hrwcron_jobs.{partitions.job_key(VICTIM, [])}",
        *claims,
        f"{VICTIM_SUBJECT}.forged",
    ]


async def _round_trip(session: Session) -> None:
    """A request that the server answers after everything this connection sent before it."""
    js = session.client.jetstream(prefix=WORKER_API_PREFIX)
    await js.stream_info(STREAM)


async def _assert_untouched(replica: Replica, before: dict[str, tuple[int, bytes] | None]) -> None:
    for subject, was in before.items():
        now = await _last(replica, subject)
        if subject.startswith("$KV.hrwcron_members."):
            # The replica keeps heartbeating: its key moves on, but only with heartbeats.
            assert now is not None
            msgspec.json.decode(now[1], type=Heartbeat)
            continue
        assert now == was, f"{subject} changed: {was} -> {now}"


async def test_a_worker_cannot_create_a_bucket_or_stream_at_all(
    replica: Replica, sessions: dict[str, Session]
) -> None:
    """The republish attack: a bucket the worker creates, whose rule republishes its writes
    into the jobs bucket. Workers may create nothing, under either API prefix."""
    worker = sessions["worker"]
    shaped = StreamConfig(
        name="KV_hrwcron_processed_evil",
        subjects=["$KV.hrwcron_processed_evil.>"],
        republish=RePublish(src=">", dest="$KV.hrwcron_jobs.>"),
    )
    for prefix in (WORKER_API_PREFIX, "$JS.API"):
        with pytest.raises((NatsError, TimeoutError)):
            await asyncio.wait_for(worker.client.jetstream(prefix=prefix).add_stream(shaped), 5)
    assert await replica.stores.jobs.get("pwned.by.worker") is None


async def test_a_workers_reply_subjects_stay_in_its_own_account(
    replica: Replica, sessions: dict[str, Session]
) -> None:
    worker = sessions["worker"]
    targets = _targets(replica)
    before = {subject: await _last(replica, subject) for subject in targets}
    for target in targets:
        # A write it may make (its own idempotency key), and a JetStream API call it may make.
        await worker.client.publish("$KV.hrwcron_processed.roles.x", b"{}", reply=target)
        await worker.client.publish(f"{WORKER_API_PREFIX}.STREAM.INFO.{STREAM}", b"", reply=target)
    await _round_trip(worker)
    # The writes themselves landed: the requests were served, only their replies went home.
    js = worker.client.jetstream(prefix=WORKER_API_PREFIX)

    async def written() -> bool:
        try:
            msg = await js.get_last_msg("KV_hrwcron_processed", "$KV.hrwcron_processed.roles.x")
        except NotFoundError:
            return False
        return bool(msg.data)

    await wait_for_async(written, timeout=30, message="the worker's own write landed")
    await _assert_untouched(replica, before)
    assert replica.scheduler.ready
    assert worker.violations() == []


async def test_an_admins_reply_subjects_stay_in_its_own_account(
    replica: Replica, sessions: dict[str, Session]
) -> None:
    admin = sessions["admin"]
    targets = _targets(replica)
    before = {subject: await _last(replica, subject) for subject in targets}
    request = msgspec.json.encode({"name": VICTIM})
    for target in targets:
        await admin.client.publish("hrwcron.admin.jobs.get", request, reply=target)
    # The same request on an inbox is answered, and after the ones above.
    answer = await admin.client.request("hrwcron.admin.jobs.get", request, timeout=10)
    assert VICTIM in answer.data.decode()
    await _assert_untouched(replica, before)
    assert admin.violations() == []


async def test_what_one_worker_can_do_to_another_is_what_the_docs_say(
    replica: Replica, sessions: dict[str, Session], shipped_cluster: ShippedCluster
) -> None:
    """The shipped `worker` user serves any worker group: it may write any group's
    idempotency records and any job's run marker (docs/security.md says so, and how to pin a user
    to one group). It still cannot touch the scheduler's buckets or the trigger stream."""
    worker = sessions["worker"]
    js = worker.client.jetstream(prefix=WORKER_API_PREFIX)
    ack = await js.publish("$KV.hrwcron_processed.other-group.x.due.1", b"{}")
    assert ack.seq > 0
    ack = await js.publish(f"$KV.hrwcron_runs.{VICTIM}", b"")
    assert ack.seq > 0
    for subject in (f"$KV.hrwcron_jobs.{VICTIM}", f"{VICTIM_SUBJECT}.forged"):
        await worker.denied(subject)


async def test_a_worker_needs_its_consumer_made_by_the_operator(
    replica: Replica, sessions: dict[str, Session], shipped_cluster: ShippedCluster
) -> None:
    from hrwcron.worker import Worker, WorkerSetupError

    async def handle(trigger: object) -> None:
        raise AssertionError("no trigger can arrive without a consumer")

    worker = Worker(
        sessions["worker"].client,
        handle,
        durable="roles-unprovisioned",
        subjects=VICTIM_SUBJECT,
        api_prefix=WORKER_API_PREFIX,
    )
    with pytest.raises(WorkerSetupError, match="hrwcron provision --worker-group"):
        await worker.start()


async def test_an_anonymous_worker_account_connection_sees_no_jetstream(
    shipped_cluster: ShippedCluster, passwords: dict[str, str]
) -> None:
    """WORKERS has no JetStream of its own, so no stream there could capture a reply."""
    nc = await nats.connect(
        servers=shipped_cluster.urls, user="worker", password=passwords["worker"]
    )
    try:
        with pytest.raises(NatsError):
            await nc.jetstream().account_info()
    finally:
        await nc.close()


async def test_only_replicas_may_say_how_far_an_owner_has_got(
    replica: Replica, sessions: dict[str, Session]
) -> None:
    """A forged progress mark could make followers stand by while an owner is gone; the
    replicas announce theirs on the scheduler's account, where no worker or admin reaches."""
    subject = replica.config.scheduler.marks_subject
    heard: asyncio.Queue[bytes] = asyncio.Queue()

    async def deliver(msg: nats.aio.msg.Msg) -> None:
        heard.put_nowait(msg.data)

    subscription = await replica.stores.client.subscribe(subject, cb=deliver)
    try:
        mark = msgspec.json.decode(await asyncio.wait_for(heard.get(), 10), type=Mark)
        assert mark.node == NODE  # the replica's own marks go out here
        for role in ("worker", "admin"):
            await sessions[role].denied(subject)
    finally:
        await subscription.unsubscribe()


async def test_replicas_holding_shares_answer_for_every_job_under_the_shipped_accounts(
    shipped_cluster: ShippedCluster, passwords: dict[str, str], sessions: dict[str, Session]
) -> None:
    """Two replicas with one holder per lane each hold half the jobs: what an operator asks
    about the other half goes from replica to replica, which the scheduler role must allow."""
    started: list[Replica] = []
    try:
        for node in ("shares-a", "shares-b"):
            text = config_text(shipped_cluster.urls, passwords["scheduler"])
            text = text.replace(f'node_id = "{NODE}"', f'node_id = "{node}"\nholders = 1')
            config = parse_config(text, "test", {})
            started.append(await asyncio.wait_for(start_replica(config, {}), 120))
        admin = sessions["admin"].client
        names = [f"shares.j{i}" for i in range(8)]
        for name in names:
            spec = {"name": name, "schedule": "@hourly"}
            put = await admin.request(
                "hrwcron.admin.jobs.put", msgspec.json.encode({"spec": spec}), timeout=10
            )
            assert b'"revision"' in put.data, put.data

        def split() -> bool:
            held = [set(r.scheduler.jobs) & set(names) for r in started]
            return all(held) and not held[0] & held[1] and held[0] | held[1] == set(names)

        await wait_for_async(split, timeout=30, message="each replica holds its half")
        for name in names:
            got = await admin.request(
                "hrwcron.admin.jobs.get", msgspec.json.encode({"name": name}), timeout=10
            )
            assert msgspec.json.decode(got.data)["name"] == name, got.data
        listed = await admin.request(
            "hrwcron.admin.jobs.list", msgspec.json.encode({"prefix": "shares."}), timeout=10
        )
        assert [j["name"] for j in msgspec.json.decode(listed.data)["jobs"]] == sorted(names)
        assert sum(r.admin.sent_on for r in started if r.admin is not None) > 0
        assert sessions["admin"].violations() == []
    finally:
        for running in started:
            await asyncio.wait_for(running.stop(), 30)
