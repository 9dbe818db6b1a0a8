"""A replica always stops when told, within shutdown_timeout plus a second, in every phase:
while NATS cannot be reached, while running, and after its connection was closed for good
(then it exits by itself, non-zero, so its supervisor restarts it)."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from pathlib import Path

import pytest
from nats.aio.msg import Msg

from harness import NatsServer, free_ports
from harness.commands import replica
from hrwcron.adapters.jetstream.connect import connect, drain_within
from hrwcron.core.config import NatsConfig

DEADLINE = 30.0

GRACE = 2.0  # shutdown_timeout of the replicas below
STOPPED_WITHIN = GRACE + 1.0 + 1.0  # the promise, and a second for a loaded test machine


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_a_replica_that_cannot_reach_nats(
    tmp_path: Path, sig: signal.Signals
) -> None:
    (port,) = free_ports(1)  # nothing listens there
    proc = replica(
        f"nats://127.0.0.1:{port}",
        "lonely",
        tmp_path / "lonely.log",
        HRWCRON_SCHEDULER_SHUTDOWN_TIMEOUT=str(GRACE),
        HRWCRON_NATS_CONNECT_TIMEOUT="1s",
    )
    with proc:
        first = proc.wait_for_log(r"WARNING .*nats: .*", DEADLINE)
        # Retries go on, but the next line about them comes seconds later, with a count.
        again = proc.wait_for_log(
            r"nats: .*\((\d+) more since the last report\)", DEADLINE, since=first.end()
        )
        assert int(again.group(1)) >= 2
        between = proc.output()[first.end() : again.start()]
        assert "nats:" not in between
        assert proc.running
        os.kill(proc.pid, sig)
        assert proc.wait(STOPPED_WITHIN) == 0, proc.output()[-2000:]
        assert "stopping while starting" in proc.output()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
async def test_a_signal_stops_a_running_replica(
    nats_server: NatsServer, tmp_path: Path, sig: signal.Signals
) -> None:
    proc = replica(
        nats_server.url,
        "busy",
        tmp_path / "busy.log",
        HRWCRON_SCHEDULER_SHUTDOWN_TIMEOUT=str(GRACE),
    )
    with proc:
        proc.wait_for_log(r"replica busy started", DEADLINE)
        os.kill(proc.pid, sig)
        assert proc.wait(STOPPED_WITHIN) == 0, proc.output()[-2000:]
        assert "stopped" in proc.output()


async def test_a_replica_whose_connection_is_closed_for_good_exits_non_zero(
    tmp_path: Path,
) -> None:
    users = 'authorization {{ users: [{{user: "s", password: "{}"}}] }}\n'
    # No server name: a name given on the command line would make the reload fail.
    server = NatsServer(config_text=users.format("first"), base_dir=tmp_path / "n")
    server.start()
    try:
        proc = replica(
            f"nats://s:first@127.0.0.1:{server.port}",
            "doomed",
            tmp_path / "doomed.log",
            HRWCRON_SCHEDULER_SHUTDOWN_TIMEOUT=str(GRACE),
        )
        with proc:
            proc.wait_for_log(r"replica doomed started", DEADLINE)
            # The password changes under it: the server closes the connection with an
            # authorization error, after which nats-py never reconnects.
            server.config_path.write_text(users.format("second"))
            os.kill(server.pid, signal.SIGHUP)
            proc.wait_for_log(r"closed for good", DEADLINE)
            assert proc.wait(STOPPED_WITHIN) == 1, proc.output()[-2000:]
    finally:
        server.cleanup()


async def test_a_signal_stops_a_replica_whose_server_stopped_answering(
    nats_server: NatsServer, tmp_path: Path
) -> None:
    proc = replica(
        nats_server.url,
        "stuck",
        tmp_path / "stuck.log",
        HRWCRON_SCHEDULER_SHUTDOWN_TIMEOUT=str(GRACE),
    )
    with proc:
        proc.wait_for_log(r"replica stuck started", DEADLINE)
        # Every request from here on waits for an answer that never comes.
        nats_server.pause()
        try:
            os.kill(proc.pid, signal.SIGTERM)
            assert proc.wait(STOPPED_WITHIN) is not None, proc.output()[-2000:]
        finally:
            nats_server.resume()


def test_a_replica_on_a_server_without_jetstream_exits_with_a_clear_error(
    tmp_path: Path,
) -> None:
    """As after a cluster lost power, when the server answers but JetStream does not (yet): the
    replica retries for startup_timeout, saying so once, then says why in one line and exits
    non-zero for its supervisor."""
    server = NatsServer(base_dir=tmp_path / "n", jetstream=False).start()
    try:
        proc = replica(
            server.url, "nojs", tmp_path / "nojs.log", HRWCRON_SCHEDULER_STARTUP_TIMEOUT="3s"
        )
        with proc:
            assert proc.wait(DEADLINE) == 1, proc.output()[-2000:]
        output = proc.output()
        gave_up = "could not start: NATS did not serve JetStream within 3 s ("
        assert gave_up in output, output[-2000:]
        assert output.count("start-up: JetStream is not serving yet") == 1, output[-2000:]
        assert len([line for line in output.splitlines() if " ERROR " in line]) == 1
        assert "Traceback" not in output
    finally:
        server.cleanup()


async def test_draining_a_connection_whose_subscriber_is_stuck_leaves_nothing_unretrieved(
    nats_server: NatsServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A replica's last step drains its connection, bounded. A subscription whose callback
    is still busy holds the drain past that bound; what the bound leaves behind must not be
    an exception nobody retrieved (logged with a traceback, the chaos suite's sign of a
    broken replica)."""
    client = await connect(NatsConfig(servers=[nats_server.url]))
    busy = asyncio.Event()
    never = asyncio.Event()

    async def stuck(msg: Msg) -> None:
        busy.set()
        await never.wait()

    await client.subscribe("stuck.here", cb=stuck)
    await client.publish("stuck.here", b"x")
    await asyncio.wait_for(busy.wait(), DEADLINE)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        await drain_within(client, 0.2)
        gc.collect()
    assert client.is_closed
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]
