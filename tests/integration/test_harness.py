"""The harness itself, against real nats-server processes.

Every later integration and chaos test trusts these helpers to inject exactly the fault they
name, so each fault is checked here for an effect a client can observe.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import KeyValueConfig, StorageType

import harness.nats
from harness import (
    NatsCluster,
    NatsServer,
    NatsServerError,
    ReplicaProcess,
    TcpProxy,
    free_ports,
    nats_server_binary,
    wait_for,
    wait_for_async,
)
from harness.timings import QUICK, SHIPPED, Timings
from hrwcron.core.config import SchedulerConfig, config_warnings, load_config

RETRYABLE = (nats.errors.Error, TimeoutError)


def _state(pid: int) -> str:
    """The kernel's one-letter process state; ``T`` means stopped by a signal."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


async def _connect(servers: str | list[str], **kwargs: object) -> Client:
    options: dict[str, object] = {
        "connect_timeout": 2,
        "reconnect_time_wait": 0.1,
        "max_reconnect_attempts": -1,
    }
    options.update(kwargs)
    return await nats.connect(servers, **options)  # type: ignore[arg-type]


@pytest.fixture
async def echo(nats_server: NatsServer) -> AsyncIterator[Client]:
    """A direct (unproxied) connection answering requests on ``echo``."""
    nc = await _connect(nats_server.url)

    async def reply(msg: Msg) -> None:
        await msg.respond(msg.data)

    await nc.subscribe("echo", cb=reply)
    await nc.flush()
    yield nc
    await nc.close()


# --- single node -----------------------------------------------------------------------------


def test_binary_is_found() -> None:
    assert os.access(nats_server_binary(), os.X_OK)


async def test_single_node_kv_roundtrip(nats_server: NatsServer) -> None:
    assert nats_server.running and nats_server.pid > 0
    assert nats_server.url == f"nats://127.0.0.1:{nats_server.port}"
    assert nats_server.store_dir.is_dir()
    nc = await _connect(nats_server.url)
    try:
        kv = await nc.jetstream().create_key_value(config=KeyValueConfig(bucket="roundtrip"))
        await kv.put("k", b"v1")
        assert (await kv.get("k")).value == b"v1"
    finally:
        await nc.close()
    assert (nats_server.store_dir / "jetstream").is_dir()


async def test_restart_keeps_jetstream_data(nats_server: NatsServer) -> None:
    url = nats_server.url
    nc = await _connect(url)
    kv = await nc.jetstream().create_key_value(
        config=KeyValueConfig(bucket="durable", storage=StorageType.FILE)
    )
    await kv.put("graceful", b"1")
    await nc.close()

    old_pid = nats_server.pid
    nats_server.restart()
    assert nats_server.pid != old_pid and nats_server.url == url

    nc = await _connect(url)
    try:
        kv = await nc.jetstream().key_value("durable")
        assert (await kv.get("graceful")).value == b"1"
        await kv.put("crash", b"2")
    finally:
        await nc.close()

    nats_server.restart(graceful=False)
    nc = await _connect(url)
    try:
        kv = await nc.jetstream().key_value("durable")
        assert (await kv.get("crash")).value == b"2"
    finally:
        await nc.close()


async def test_pause_freezes_and_resume_thaws(nats_server: NatsServer, echo: Client) -> None:
    nc = await _connect(nats_server.url)
    try:
        nats_server.pause()
        assert nats_server.paused
        wait_for(lambda: _state(nats_server.pid) == "T", timeout=5, message="server stopped")
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request("echo", b"x", timeout=0.3)
        nats_server.resume()
        reply = await wait_for_async(
            lambda: nc.request("echo", b"y", timeout=0.5),
            timeout=5,
            message="request answered after SIGCONT",
            ignore=RETRYABLE,
        )
        assert reply.data == b"y"
    finally:
        await nc.close()


def test_failed_start_reports_log_errors(tmp_path: Path) -> None:
    bad = NatsServer(config_text="this is { not valid", base_dir=tmp_path / "bad")
    with pytest.raises(NatsServerError, match="Parse error") as info:
        bad.start()
    assert not bad.running
    assert "exited during start-up" in str(info.value)

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        busy = NatsServer(port=taken, base_dir=tmp_path / "busy")
        with pytest.raises(NatsServerError, match="address already in use"):
            busy.start()
    assert not busy.running


def test_config_text_is_applied(tmp_path: Path) -> None:
    with NatsServer(config_text="max_payload: 4096\n", base_dir=tmp_path / "cfg") as server:
        assert server.varz()["max_payload"] == 4096
        assert server.healthy()


# --- cluster ---------------------------------------------------------------------------------


@pytest.mark.cluster
async def test_cluster_smoke_survives_leader_kill_and_rejoin(nats_cluster: NatsCluster) -> None:
    assert len(nats_cluster.servers) == 3 and len(set(nats_cluster.urls)) == 3
    assert nats_cluster.url == ",".join(nats_cluster.urls)
    assert nats_cluster.meta_leader() is not None

    nc = await _connect(nats_cluster.urls)
    try:
        js = nc.jetstream(timeout=2)
        kv = await js.create_key_value(
            config=KeyValueConfig(bucket="smoke", replicas=3, storage=StorageType.FILE)
        )
        leader = nats_cluster.wait_stream_leader("KV_smoke", timeout=10)
        # A new stream's subject interest reaches the other nodes a moment after the create
        # returns; until then a publish through them gets "no responders".
        await wait_for_async(
            lambda: kv.put("before", b"1"),
            timeout=10,
            message="first write to the new R3 bucket",
            ignore=RETRYABLE,
        )
        victim_pid = nats_cluster.servers[leader].pid
        nats_cluster.kill(leader)
        with pytest.raises(ProcessLookupError):
            os.kill(victim_pid, 0)

        new_leader = nats_cluster.wait_stream_leader("KV_smoke", timeout=15, exclude=[leader])
        assert new_leader != leader
        await wait_for_async(
            lambda: kv.put("after", b"2"),
            timeout=15,
            message="R3 bucket writable with one node down",
            ignore=RETRYABLE,
        )
        assert (await kv.get("before")).value == b"1"
        assert (await kv.get("after")).value == b"2"

        nats_cluster.restart(leader)
        assert nats_cluster.servers[leader].running
        assert nats_cluster.servers[leader].pid != victim_pid
    finally:
        await nc.close()

    # Only the rejoined node: it must hold the write made while it was down.
    rejoined = await _connect(nats_cluster.servers[leader].url)
    try:
        kv = await rejoined.jetstream(timeout=2).key_value("smoke")
        entry = await wait_for_async(
            lambda: kv.get("after"),
            timeout=15,
            message="rejoined node serves the bucket",
            ignore=RETRYABLE,
        )
        assert entry.value == b"2"
    finally:
        await rejoined.close()

    def caught_up() -> bool:
        view = nats_cluster.servers[leader].jsz(accounts=True, streams=True)
        details = [d for a in view["account_details"] for d in a.get("stream_detail", [])]
        return any(d["name"] == "KV_smoke" and d["state"]["messages"] == 2 for d in details)

    wait_for(caught_up, timeout=15, message="rejoined replica has both messages")


@pytest.mark.cluster
def test_cluster_retries_when_a_route_port_is_taken(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes: list[list[int]] = []
    real_free_ports = harness.nats.free_ports

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()

        def first_probe_collides(count: int) -> list[int]:
            ports = real_free_ports(count)
            if not probes:
                ports[1] = squatter.getsockname()[1]
            probes.append(ports)
            return ports

        monkeypatch.setattr(harness.nats, "free_ports", first_probe_collides)
        with NatsCluster(3, base_dir=tmp_path / "cluster") as cluster:
            assert len(probes) == 2
            assert cluster.meta_leader() is not None
            assert all(server.running for server in cluster.servers)
    assert "address already in use" in (tmp_path / "cluster/attempt0/n1/server.log").read_text()


# --- TCP proxy -------------------------------------------------------------------------------


def test_proxy_from_sync_code(nats_server: NatsServer) -> None:
    with TcpProxy(nats_server.port) as proxy:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=2) as sock:
            assert sock.recv(4096).startswith(b"INFO ")
            proxy.stall()
            sock.sendall(b"PING\r\n")
            sock.settimeout(0.3)
            with pytest.raises(TimeoutError):
                sock.recv(4096)
            proxy.passthrough()
            sock.settimeout(2)
            # The held PING is delivered once the stall ends, as after a network outage.
            assert b"PONG" in sock.recv(4096)
        proxy.drop()
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()
        assert proxy.mode == "drop"
    with pytest.raises(ValueError):
        TcpProxy(nats_server.port, "10.0.0.1")


async def test_proxy_pass_and_slow(nats_server: NatsServer, echo: Client) -> None:
    with TcpProxy.to(nats_server) as proxy:
        nc = await _connect(proxy.url)
        try:
            assert (await nc.request("echo", b"a", timeout=2)).data == b"a"
            proxy.slow(0.25)
            started = time.monotonic()
            assert (await nc.request("echo", b"b", timeout=3)).data == b"b"
            # Delayed once on the way out and once on the way back.
            assert time.monotonic() - started >= 0.45
            proxy.passthrough()
            started = time.monotonic()
            await nc.request("echo", b"c", timeout=2)
            assert time.monotonic() - started < 0.25
        finally:
            await nc.close()


async def test_proxy_drop_disconnects_and_refuses(nats_server: NatsServer, echo: Client) -> None:
    disconnected = asyncio.Event()
    reconnected = asyncio.Event()

    async def on_disconnect() -> None:
        disconnected.set()

    async def on_reconnect() -> None:
        reconnected.set()

    with TcpProxy.to(nats_server) as proxy:
        nc = await _connect(proxy.url, disconnected_cb=on_disconnect, reconnected_cb=on_reconnect)
        try:
            proxy.drop()
            await asyncio.wait_for(disconnected.wait(), 5)
            assert proxy.active_connections == 0
            with pytest.raises(ConnectionRefusedError):
                await asyncio.open_connection("127.0.0.1", proxy.port)
            assert not reconnected.is_set()
            proxy.passthrough()
            await asyncio.wait_for(reconnected.wait(), 5)
            assert (await nc.request("echo", b"back", timeout=2)).data == b"back"
        finally:
            await nc.close()


async def test_proxy_stall_times_out_requests(nats_server: NatsServer, echo: Client) -> None:
    with TcpProxy.to(nats_server) as proxy:
        nc = await _connect(proxy.url)
        try:
            proxy.stall()
            with pytest.raises(nats.errors.TimeoutError):
                await nc.request("echo", b"x", timeout=0.3)
            assert nc.is_connected and proxy.active_connections == 1
            proxy.passthrough()
            assert (await nc.request("echo", b"y", timeout=2)).data == b"y"
        finally:
            await nc.close()


async def test_proxy_half_open_loses_only_replies(nats_server: NatsServer, echo: Client) -> None:
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def collect(msg: Msg) -> None:
        await received.put(msg.data)

    await echo.subscribe("half", cb=collect)
    await echo.flush()
    with TcpProxy.to(nats_server) as proxy:
        nc = await _connect(proxy.url)
        try:
            proxy.half_open()
            await nc.publish("half", b"out")
            assert await asyncio.wait_for(received.get(), 5) == b"out"
            with pytest.raises(nats.errors.TimeoutError):
                await nc.request("echo", b"x", timeout=0.3)
            # Leaving half-open resets the damaged connection; the client reconnects.
            proxy.passthrough()
            reply = await wait_for_async(
                lambda: nc.request("echo", b"y", timeout=0.5),
                timeout=10,
                message="request answered after half-open ends",
                ignore=RETRYABLE,
            )
            assert reply.data == b"y"
        finally:
            await nc.close()


# --- replica processes -----------------------------------------------------------------------

CHILD = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (print("bye", flush=True), sys.exit(3)))
print("ready", flush=True)
n = 0
while True:
    n += 1
    print(f"tick {n}", flush=True)
    time.sleep(0.02)
"""


def test_replica_process_lifecycle(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    with ReplicaProcess(["-c", CHILD], {"HRWCRON_X": "1"}, log, module=None) as child:
        assert child.argv[:2] == [sys.executable, "-c"]
        child.wait_for_log(r"^ready$", timeout=10)
        assert os.getpgid(child.pid) == child.pid

        child.pause()
        wait_for(lambda: _state(child.pid) == "T", timeout=5, message="child stopped")
        child.resume()
        wait_for(lambda: _state(child.pid) != "T", timeout=5, message="child continued")
        mark = child.mark()
        child.wait_for_log(r"tick \d+", timeout=5, since=mark)

        status = child.terminate(timeout=5)
        assert status.returncode == 3 and status.elapsed < 5
        assert "bye" in child.output()

    with pytest.raises(AssertionError, match="exited with 0"):
        ReplicaProcess(["-c", "print('nope')"], {}, log, module=None).wait_for_log("never", 5)

    stubborn = ReplicaProcess(
        [
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "print('up', flush=True); time.sleep(60)",
        ],
        {},
        tmp_path / "stubborn.log",
        module=None,
    )
    stubborn.wait_for_log("up", timeout=10)
    code, elapsed = stubborn.terminate(timeout=0.3)
    assert code == -signal.SIGKILL and 0.3 <= elapsed < 5

    victim = ReplicaProcess(
        ["-c", "import time; time.sleep(60)"], {}, tmp_path / "v.log", module=None
    )
    assert victim.kill() == -signal.SIGKILL


def test_faketime_shifts_only_the_wall_clock(
    faketime: Callable[[float], dict[str, str]], tmp_path: Path
) -> None:
    env = faketime(3600)
    assert env["FAKETIME"] == "+3600s" and env["FAKETIME_DONT_FAKE_MONOTONIC"] == "1"
    script = "import time; print(time.time(), time.monotonic(), flush=True)"
    child = ReplicaProcess(["-c", script], env, tmp_path / "ft.log", module=None)
    assert child.wait(10) == 0
    wall, mono = (float(x) for x in child.output().split())
    assert 3590 < wall - time.time() < 3610
    assert abs(mono - time.monotonic()) < 60


def test_free_ports_are_distinct() -> None:
    ports = free_ports(5)
    assert len(set(ports)) == 5 and all(p > 0 for p in ports)


@pytest.mark.parametrize("timings", [QUICK, SHIPPED], ids=["quick", "shipped"])
def test_the_harness_timings_are_a_configuration_a_replica_accepts_without_warning(
    timings: Timings,
) -> None:
    """Replicas given the harness's timings start with exactly those, and none is fragile."""
    config = load_config(None, {"HRWCRON_NATS_URL": "nats://127.0.0.1:1", **timings.env()})
    assert {key: getattr(config.scheduler, key) for key in timings.settings()} == (
        timings.settings()
    )
    assert config_warnings(config) == []


def test_shipped_timings_are_the_defaults_a_user_gets() -> None:
    shipped = SchedulerConfig()
    assert SHIPPED.settings() == {key: getattr(shipped, key) for key in SHIPPED.settings()}
    assert QUICK.member_ttl < SHIPPED.member_ttl and QUICK.failover_step < SHIPPED.failover_step
