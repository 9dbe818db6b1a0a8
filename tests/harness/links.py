"""The network between the nodes of a test cluster: every route through a forwarder the test
controls, so it can cut, blackhole or slow the links between NATS servers.

For a cluster of ``n`` nodes there is one forwarder per ordered pair: node ``i`` dials its
route to node ``j`` through forwarder ``(i, j)``, which connects to ``j``'s cluster port. The
servers keep one set of route connections per pair, dialled by either side, so a link (a pair)
is set through both of its forwarders, and a direction (``a`` to ``b``) is the client-to-server
bytes of forwarder ``(a, b)`` and the server-to-client bytes of forwarder ``(b, a)``.

What a direction can be:

* ``pass``;
* ``cut``: every connection of the link is reset and new ones are reset at once (a link down,
  or a firewall that rejects): nats-server notices at once and keeps redialling;
* ``lose``: everything sent that way from now on is discarded, the connection stays up (a
  black hole); no partial frame is ever delivered, and when the direction passes again the
  connections that lost bytes are reset, as a real half-dead connection ends;
* ``delay``: each chunk is delivered ``delay_s`` plus up to ``jitter_s`` after it was read, in
  order, without capping the throughput (a long or congested path).

All forwarders run on one event loop in a daemon thread; every control call is bounded.
Servers learn each other's route address by gossip and would dial it directly, around the
forwarders: the cluster therefore advertises a port nothing listens on (see
:class:`harness.routes.RoutedCluster`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import threading
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["CUT", "DELAY", "LOSE", "PASS", "Direction", "LinkNet"]

PASS = "pass"
CUT = "cut"
LOSE = "lose"
DELAY = "delay"
_STATES = (PASS, CUT, LOSE, DELAY)
LOOPBACK = "127.0.0.1"
CHUNK = 65536
QUEUED_CHUNKS = 256  # per direction of a connection, before reading waits for delivery

T = TypeVar("T")


@dataclass(frozen=True)
class Direction:
    """How bytes from one node to another fare."""

    state: str = PASS
    delay_s: float = 0.0
    jitter_s: float = 0.0

    def __str__(self) -> str:
        if self.state == DELAY:
            return f"delay {self.delay_s * 1000:.0f} ms + up to {self.jitter_s * 1000:.0f} ms"
        return self.state


class _Conn:
    __slots__ = ("client", "lost", "pair", "upstream")

    def __init__(self, pair: tuple[int, int], client: asyncio.StreamWriter) -> None:
        self.pair = pair
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        self.lost = False

    def abort(self) -> None:
        self.client.transport.abort()
        if self.upstream is not None:
            self.upstream.transport.abort()


class LinkNet:
    """Forwarders for every ordered pair of ``size`` nodes; see the module docstring."""

    def __init__(self, size: int, *, seed: int = 0) -> None:
        self.size = size
        self._rng = random.Random(seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="LinkNet", daemon=True)
        self._servers: dict[tuple[int, int], asyncio.Server] = {}
        self._targets: dict[tuple[int, int], int] = {}
        self.ports: dict[tuple[int, int], int] = {}
        self._ways: dict[tuple[int, int], Direction] = {}
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        # A bound socket that never listens: the address the servers advertise, so that a
        # route learned by gossip is refused instead of going around the forwarders.
        self._dead = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._dead.bind((LOOPBACK, 0))
        self.dead_port: int = self._dead.getsockname()[1]
        self._thread.start()

    # --- set-up ---------------------------------------------------------------------------

    def forward(self, cluster_ports: list[int]) -> dict[tuple[int, int], int]:
        """(Re)create the forwarders towards ``cluster_ports`` (node j's route port); returns
        the port node i dials for node j, per (i, j)."""
        if len(cluster_ports) != self.size:
            raise ValueError(f"{len(cluster_ports)} ports for {self.size} nodes")
        self._call(self._close_all)
        for i in range(self.size):
            for j in range(self.size):
                if i != j:
                    self._targets[(i, j)] = cluster_ports[j]
                    self.ports[(i, j)] = self._call(lambda i=i, j=j: self._listen(i, j))
        return dict(self.ports)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._close_all)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        if not self._thread.is_alive():
            self._loop.close()
        self._dead.close()

    # --- control (any thread) -------------------------------------------------------------

    def way(self, src: int, dst: int) -> Direction:
        return self._ways.get((src, dst), Direction())

    def set_way(self, src: int, dst: int, way: Direction) -> None:
        """How bytes from node ``src`` to node ``dst`` fare from now on."""
        if way.state not in _STATES:
            raise ValueError(f"unknown state {way.state!r}; expected one of {_STATES}")
        if src == dst or not (0 <= src < self.size and 0 <= dst < self.size):
            raise ValueError(f"no link from {src} to {dst}")

        async def apply() -> None:
            self._ways[(src, dst)] = way
            pair = (min(src, dst), max(src, dst))
            for conn in list(self._conns):
                if _pair_of(conn) != pair:
                    continue
                cut = CUT in (self.way(src, dst).state, self.way(dst, src).state)
                healed = LOSE not in (self.way(src, dst).state, self.way(dst, src).state)
                if cut or (conn.lost and healed):
                    conn.abort()
                    self._conns.discard(conn)

        self._call(apply)

    def set_link(self, a: int, b: int, way: Direction) -> None:
        """Both directions between ``a`` and ``b``."""
        self.set_way(a, b, way)
        self.set_way(b, a, way)

    def cut(self, groups: Iterable[Iterable[int]], way: Direction | None = None) -> list[str]:
        """Every link between nodes of different ``groups`` set to ``way`` (cut by default);
        returns the links it set, as ``"a-b"``."""
        sides = [set(g) for g in groups]
        done = []
        for a in range(self.size):
            for b in range(a + 1, self.size):
                if any(a in s and b not in s for s in sides):
                    self.set_link(a, b, way or Direction(CUT))
                    done.append(f"{a}-{b}")
        return done

    def heal(self) -> None:
        for src in range(self.size):
            for dst in range(self.size):
                if src != dst and self.way(src, dst).state != PASS:
                    self.set_way(src, dst, Direction())

    def connections(self, a: int, b: int) -> int:
        """Route connections between ``a`` and ``b`` open through the forwarders right now."""
        pair = (min(a, b), max(a, b))
        return sum(1 for conn in list(self._conns) if _pair_of(conn) == pair)

    # --- event-loop side ------------------------------------------------------------------

    def _call(self, fn: Callable[[], Coroutine[Any, Any, T]], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(fn(), self._loop).result(timeout)

    async def _listen(self, i: int, j: int) -> int:
        server = await asyncio.start_server(
            lambda r, w: self._handle((i, j), r, w), LOOPBACK, self.ports.get((i, j), 0)
        )
        self._servers[(i, j)] = server
        return int(server.sockets[0].getsockname()[1])

    async def _close_all(self) -> None:
        for server in self._servers.values():
            server.close()
        self._servers.clear()
        for conn in list(self._conns):
            conn.abort()
        self._conns.clear()
        tasks = [t for t in self._tasks if not t.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _handle(
        self, dialled: tuple[int, int], creader: asyncio.StreamReader, cwriter: asyncio.StreamWriter
    ) -> None:
        src, dst = dialled
        conn = _Conn(dialled, cwriter)
        if CUT in (self.way(src, dst).state, self.way(dst, src).state):
            conn.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._conns.add(conn)
        try:
            sreader, swriter = await asyncio.wait_for(
                asyncio.open_connection(LOOPBACK, self._targets[dialled]), 5.0
            )
            conn.upstream = swriter
            if conn not in self._conns:  # cut while connecting
                return
            pipes = {
                asyncio.ensure_future(self._pipe(creader, swriter, src, dst, conn)),
                asyncio.ensure_future(self._pipe(sreader, cwriter, dst, src, conn)),
            }
            try:
                await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pipe in pipes:
                    pipe.cancel()
                await asyncio.gather(*pipes, return_exceptions=True)
        except (OSError, TimeoutError):
            pass
        finally:
            self._conns.discard(conn)
            conn.abort()
            self._tasks.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        src: int,
        dst: int,
        conn: _Conn,
    ) -> None:
        """Bytes from ``src`` to ``dst``: read as they come, delivered when their direction
        says, in order, through a queue so that a delay adds latency, not a throughput cap."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(QUEUED_CHUNKS)

        async def deliver() -> None:
            while True:
                at, data = await queue.get()
                wait = at - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
                queue.task_done()

        sender = asyncio.ensure_future(deliver())
        last = 0.0
        try:
            while not sender.done():
                data = await reader.read(CHUNK)
                if not data:
                    # Let what is on its way arrive before the connection ends.
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(queue.join(), 5.0)
                    return
                way = self.way(src, dst)
                if way.state == CUT:
                    return
                if way.state == LOSE:
                    conn.lost = True
                    continue
                at = loop.time()
                if way.state == DELAY:
                    at += way.delay_s + (self._rng.uniform(0, way.jitter_s) if way.jitter_s else 0)
                last = max(last, at)
                await queue.put((last, data))
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError, OSError):
                await sender


def _pair_of(conn: _Conn) -> tuple[int, int]:
    a, b = conn.pair
    return (min(a, b), max(a, b))
