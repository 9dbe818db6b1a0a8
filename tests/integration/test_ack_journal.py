"""The ack journal of the power-loss checks (harness/ackjournal.py) on a real replica: it must
record the PubAcks of the triggers the engine publishes, whatever path the engine takes to
publish them, or every lost-ack check built on it would pass without looking at anything."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from nats.aio.client import Client
from nats.js.errors import NotFoundError

from harness import NatsServer, ReplicaProcess, wait_for_async
from harness.ackjournal import ACK_JOURNAL_ENV, find_lost_acks, read_journals, script_path
from harness.commands import HARNESS_ENV
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.core.model import JobSpec
from hrwcron.process.app import open_stores

DEADLINE = 30.0
STREAM = "HRWCRON_TRIGGERS"


@pytest.fixture
async def client(nats_server: NatsServer) -> AsyncIterator[Client]:
    config = Config(
        nats=NatsConfig(servers=[nats_server.url]),
        scheduler=SchedulerConfig(node_id="test"),
        http=HttpConfig(listen=""),
    )
    stores = await open_stores(config)  # provisions the buckets and stream like a replica
    await stores.jobs.put(JobSpec(name="journaled", schedule="@every 1s"), None)
    yield stores.client
    await stores.client.close()


async def stored(client: Client) -> list[tuple[int, str]]:
    """(seq, Msg-Id) of every trigger in the stream."""
    js = client.jetstream()
    info = await js.stream_info(STREAM)
    found = []
    for seq in range(int(info.state.first_seq or 1), int(info.state.last_seq or 0) + 1):
        try:
            msg = await js.get_msg(STREAM, seq)
        except NotFoundError:
            continue  # deleted
        found.append((seq, (msg.headers or {}).get("Nats-Msg-Id", "")))
    return found


async def test_the_journal_records_every_trigger_a_replica_publishes_and_sees_one_lost(
    nats_server: NatsServer, client: Client, tmp_path: Path
) -> None:
    journal = tmp_path / "a.acks.jsonl"
    env = {k: v for k, v in os.environ.items() if k not in HARNESS_ENV}
    env.update(
        {
            "HRWCRON_NATS_URL": nats_server.url,
            "HRWCRON_NODE_ID": "a",
            "HRWCRON_HTTP_LISTEN": "",
            ACK_JOURNAL_ENV: str(journal),
        }
    )
    proc = ReplicaProcess(
        [script_path(), "run"], env, tmp_path / "a.log", module=None, inherit_env=False
    )
    try:
        proc.wait_for_log(r"replica a started", DEADLINE)
        await wait_for_async(
            lambda: len(read_journals([journal])) >= 3, DEADLINE, message="3 acks journaled"
        )
    finally:
        proc.terminate()
    acks = read_journals([journal])
    in_stream = await stored(client)
    assert len(in_stream) >= len(acks) >= 3
    assert all(a.msg_id.startswith("journaled:") and a.stream == STREAM for a in acks)
    assert {(a.seq, a.msg_id) for a in acks} <= set(in_stream)
    assert find_lost_acks(acks, in_stream) == []

    # An acknowledged trigger that disappears is what the checks report.
    gone = acks[1]
    await client.jetstream().delete_msg(STREAM, gone.seq)
    lost = find_lost_acks(acks, await stored(client))
    assert [item.ack.msg_id for item in lost] == [gone.msg_id]
