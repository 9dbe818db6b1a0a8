"""The periodic membership read creates no JetStream consumer.

Every replica re-reads the members bucket once a second. A consumer per read is a proposal to
the cluster's meta layer; under NATS node restarts they piled up faster than the cluster removed
them, until creating any consumer was refused ("maximum consumers limit reached") and every
replica's membership view went stale at once: no replica ready, every tick missed (found by the
long chaos run). Reading the key list from the stream state and each key's last message needs
no consumer at all."""

from __future__ import annotations

from harness import NatsServer
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.core.model import Heartbeat
from hrwcron.process.app import open_stores


def heartbeat(node: str) -> Heartbeat:
    return Heartbeat(node=node, instance=f"{node}-1", started_ms=1, version="test")


async def test_membership_snapshots_leave_no_consumers_behind(nats_server: NatsServer) -> None:
    config = Config(
        nats=NatsConfig(servers=[nats_server.url]),
        scheduler=SchedulerConfig(node_id="reader"),
        http=HttpConfig(listen=""),
    )
    stores = await open_stores(config)
    try:
        for node in ("a", "b", "c"):
            await stores.members.register(node, heartbeat(node), wait=1)
        await stores.members.deregister("b")
        for _ in range(20):
            members = await stores.members.snapshot()
            assert sorted(members) == ["a", "c"]
            assert members["a"].heartbeat.instance == "a-1" and members["a"].revision > 0
        info = await stores.client.jetstream().stream_info("KV_hrwcron_members")
        assert info.state.consumer_count == 0
    finally:
        await stores.client.close()
