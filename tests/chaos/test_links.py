"""The route forwarders of the chaos cluster, against plain TCP echo servers: each state does
what the route faults rely on, in the direction it names."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from harness.links import CUT, DELAY, LOSE, Direction, LinkNet


class Echo:
    """A TCP server that sends back whatever it receives (node 1's route port)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received = bytearray()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._echo, args=(conn,), daemon=True).start()

    def _echo(self, conn: socket.socket) -> None:
        with conn:
            while data := _recv(conn):
                self.received += data
                conn.sendall(data)


def _recv(conn: socket.socket) -> bytes:
    try:
        return conn.recv(65536)
    except OSError:
        return b""


@pytest.fixture
def net() -> Iterator[tuple[LinkNet, Echo, int]]:
    echo = Echo()
    links = LinkNet(2, seed=1)
    # Node 0's port is never dialled here; node 0 dials node 1 through forwarder (0, 1).
    ports = links.forward([1, echo.port])
    try:
        yield links, echo, ports[(0, 1)]
    finally:
        links.close()
        echo.sock.close()


def dial(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    conn.settimeout(2)
    return conn


def test_pass_forwards_both_ways(net: tuple[LinkNet, Echo, int]) -> None:
    links, _, port = net
    with dial(port) as conn:
        conn.sendall(b"ping")
        assert conn.recv(10) == b"ping"
        assert links.connections(0, 1) == 1


def test_a_cut_resets_the_link_and_every_new_connection(net: tuple[LinkNet, Echo, int]) -> None:
    links, _, port = net
    conn = dial(port)
    conn.sendall(b"a")
    assert conn.recv(10) == b"a"
    links.set_link(0, 1, Direction(CUT))
    assert _recv(conn) == b""  # reset
    with dial(port) as again:  # accepted, then reset at once
        assert _recv(again) == b""
    links.heal()
    with dial(port) as healed:
        healed.sendall(b"b")
        assert healed.recv(10) == b"b"


def test_a_lost_direction_drops_only_that_way_and_heals_with_a_reset(
    net: tuple[LinkNet, Echo, int],
) -> None:
    links, echo, port = net
    conn = dial(port)
    # From node 1 back to node 0 is lost: the echo server hears, node 0 hears nothing.
    links.set_way(1, 0, Direction(LOSE))
    conn.sendall(b"hello")
    deadline = time.monotonic() + 5
    while bytes(echo.received) != b"hello" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert bytes(echo.received) == b"hello"
    with pytest.raises(TimeoutError):
        conn.recv(10)
    assert links.connections(0, 1) == 1  # the connection itself stays up
    links.heal()
    assert _recv(conn) == b""  # it lost bytes, so it is reset rather than resumed mid-frame
    with dial(port) as fresh:
        fresh.sendall(b"x")
        assert fresh.recv(10) == b"x"


def test_a_delay_adds_latency_in_order_without_capping_throughput(
    net: tuple[LinkNet, Echo, int],
) -> None:
    links, _, port = net
    links.set_link(0, 1, Direction(DELAY, 0.2, 0.05))
    with dial(port) as conn:
        began = time.monotonic()
        conn.sendall(b"1")
        assert conn.recv(10) == b"1"
        rtt = time.monotonic() - began
        assert 0.4 <= rtt < 1.0, rtt  # 0.2-0.25 s each way
        # 200 chunks sent at once arrive in order in about one round trip, not 200.
        began = time.monotonic()
        payload = b"".join(b"%04d" % i for i in range(200))
        for i in range(200):
            conn.sendall(payload[i * 4 : i * 4 + 4])
            time.sleep(0.001)
        got = b""
        conn.settimeout(5)
        while len(got) < len(payload):
            got += conn.recv(65536)
        assert got == payload
        assert time.monotonic() - began < 2.0
