"""A start that fails on a transient error is tried again in the same process
(process/startup.py): whatever the failed attempt built must not stand in the next one's way,
the console's metrics included."""

from __future__ import annotations

import msgspec
import pytest

from harness.inprocess_replicas import replica_config
from hrwcron.admin.service import AdminService
from hrwcron.core.config import HttpConfig
from hrwcron.process.app import start_replica


async def test_a_start_failing_after_the_console_was_built_is_retried_and_starts(
    nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts = 0
    start = AdminService.start

    async def fails_once(self: AdminService) -> None:
        nonlocal attempts
        attempts += 1
        if attempts == 1:  # the console and the scheduler are built and started by now
            raise TimeoutError("no answer, as while JetStream elects a leader")
        await start(self)

    monkeypatch.setattr(AdminService, "start", fails_once)
    config = msgspec.structs.replace(
        replica_config(nats_url, "retried"), http=HttpConfig(listen="127.0.0.1:0")
    )
    replica = await start_replica(config, {})
    try:
        assert attempts == 2
        assert replica.telemetry is not None and replica.http is not None
        names = [m.name for m in replica.telemetry.registry.collect()]
        assert names.count("hrwcron_console_index_build_seconds") == 1
    finally:
        await replica.stop()
