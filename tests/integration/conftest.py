"""Fixtures several integration modules share: a server with the stream and buckets exactly as
a replica provisions them, reached as a plain client or as the stores' own client."""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats
import pytest
from nats.aio.client import Client

from harness import NatsServer
from harness.inprocess_replicas import replica_config
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.process.app import open_stores


@pytest.fixture
async def nc(nats_url: str) -> AsyncIterator[Client]:
    """A plain connection to a server provisioned by a replica that has left again."""
    stores = await open_stores(replica_config(nats_url, "provisioner"))
    await stores.client.close()
    client = await nats.connect(nats_url)
    yield client
    await client.close()


@pytest.fixture
async def provisioned(nats_server: NatsServer) -> AsyncIterator[Client]:
    """The client of a replica's stores on a server it provisioned (no replica runs)."""
    config = Config(
        nats=NatsConfig(servers=[nats_server.url]),
        scheduler=SchedulerConfig(node_id="test"),
        http=HttpConfig(listen=""),
    )
    stores = await open_stores(config)
    yield stores.client
    await stores.client.close()
