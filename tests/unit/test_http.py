"""The HTTP endpoint over a fake status source: routes, status codes, limits and the token.

The console's pages, which it mounts, are tested in test_console.py."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from harness import wait_for_async
from hrwcron.adapters.http import HttpServer, parse_listen


def status_doc(text: str = "plain") -> dict[str, Any]:
    """A status document shaped like ReplicaStatus.status(), with ``text`` in every string
    that could come from a job spec or a member's heartbeat."""
    return {
        "node": "a",
        "instance": "i",
        "version": "0.1.0",
        "ready": False,
        "reason": text,
        "now_ms": 1_000_000,
        "now": "1970-01-01T00:16:40.000Z",
        "clock_offset_ms": 1.5,
        "digest": "00ff",
        "failover_step_s": 1.0,
        "members": [
            {
                "node": "a",
                "self": True,
                "heartbeat_age_s": 0.4,
                "live": False,
                "ready": False,
                "reason": text,
                "weight": 1.0,
                "tags": [text],
                "digest": text,
                "digest_matches": False,
                "jobs": 1,
                "version": text,
                "started": "",
            }
        ],
        "live": ["a"],
        "jobs_total": 2,
        "owned_total": 1,
        "limit": 1,
        "prefix": text,
        "order": "due",
        "next": f"1001000:{text}",
        "summary": {
            "jobs": 2,
            "paused": 0,
            "bad": 1,
            "owned": {"a": 1, text: 1},
            "no_owner": 0,
            "missed_last_hour": 3,
        },
        "jobs": [
            {
                "name": "billing.sweep",
                "schedule": text,
                "tz": text,
                "paused": False,
                "tags": [text],
                "description": text,
                "payload": json.dumps({"html": text}),
                "subject": "hrwcron.trigger.billing.sweep",
                "owner": "a",
                "failover": ["a", text],
                "rank": 0,
                "next_due_ms": 1_001_000,
                "next_due": "1970-01-01T00:16:41.000Z",
                "next_fire_ms": 1_001_000,
                "last": {
                    "tick": text,
                    "seq": 3,
                    "due_ms": 999_000,
                    "due": "",
                    "by": text,
                    "lateness_ms": 4.2,
                    "seen_after_ms": None,
                },
            }
        ],
        "owned": [{"name": text, "next_due_ms": 1, "next_due": "", "in_s": 1.0}],
        "bad_jobs": [{"name": text, "error": text}],
        "timeline": {
            "start_ms": 960_000,
            "start": "",
            "bucket_ms": 60_000,
            "members": {text: [0, 3, 1]},
            "partial": True,
        },
    }


class FakeSource:
    def __init__(self) -> None:
        self.reason = ""
        self.calls: list[tuple[int, bool, str, str]] = []
        self.text = "plain"

    def not_ready_reason(self) -> str:
        return self.reason

    async def status(
        self, limit: int, timeline: bool, *, prefix: str = "", after: str = ""
    ) -> dict[str, Any]:
        if after == "nonsense":
            raise ValueError("'nonsense' is not a cursor of a page in due order")
        self.calls.append((limit, timeline, prefix, after))
        return status_doc(self.text)


@pytest.fixture
async def served() -> AsyncIterator[tuple[HttpServer, FakeSource, CollectorRegistry]]:
    registry = CollectorRegistry()
    Counter("hrwcron_example", "an example", registry=registry).inc(3)
    source = FakeSource()
    server = HttpServer("127.0.0.1:0", registry=registry, source=source)
    await server.start()
    try:
        yield server, source, registry
    finally:
        await server.close()


async def request(server: HttpServer, raw: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(raw)
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return status, headers, body


async def get(
    server: HttpServer, target: str, method: str = "GET"
) -> tuple[int, dict[str, str], bytes]:
    head = f"{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    return await request(server, head.encode())


async def test_health_ready_and_metrics(
    served: tuple[HttpServer, FakeSource, CollectorRegistry],
) -> None:
    server, source, _ = served
    assert (await get(server, "/healthz"))[0] == 200
    status, _, body = await get(server, "/readyz")
    assert (status, json.loads(body)) == (200, {"ready": True})
    source.reason = "heartbeat is not reaching NATS"
    status, headers, body = await get(server, "/readyz")
    assert status == 503
    assert headers["content-type"] == "application/json"
    assert json.loads(body) == {"ready": False, "reason": "heartbeat is not reaching NATS"}
    status, headers, body = await get(server, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=")
    assert b"hrwcron_example_total 3.0" in body


async def test_status_limit_and_timeline(
    served: tuple[HttpServer, FakeSource, CollectorRegistry],
) -> None:
    server, source, _ = served
    status, _, body = await get(server, "/status?limit=7&timeline=1")
    assert status == 200
    assert json.loads(body)["node"] == "a"
    assert source.calls[-1] == (7, True, "", "")
    await get(server, "/status?prefix=billing.&after=1001000:billing.a")
    assert source.calls[-1] == (100, False, "billing.", "1001000:billing.a")
    for bad in ("abc", "0", "10001", "-1"):
        status, _, body = await get(server, f"/status?limit={bad}")
        assert status == 400
        assert "limit must be an integer from 1 to 10000" in json.loads(body)["error"]
    status, _, body = await get(server, "/status?after=nonsense")
    assert status == 400 and "not a cursor" in json.loads(body)["error"]
    status, _, body = await get(server, "/status?prefix=" + "a" * 2000)
    assert status == 400 and "longer than 1024" in json.loads(body)["error"]
    assert len(source.calls) == 2  # a bad request never reaches the source


async def test_methods_paths_and_oversized_heads(
    served: tuple[HttpServer, FakeSource, CollectorRegistry],
) -> None:
    server, _, _ = served
    status, headers, _ = await get(server, "/status", method="POST")
    assert (status, headers["allow"]) == (405, "GET, HEAD")
    assert (await get(server, "/nope"))[0] == 404
    status, headers, body = await get(server, "/healthz", method="HEAD")
    assert (status, headers["content-length"], body) == (200, "3", b"")
    assert (await request(server, b"garbage\r\n\r\n"))[0] == 400
    huge = b"GET / HTTP/1.1\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
    assert (await request(server, huge))[0] == 400  # a header line past MAX_FIELD
    assert (await get(server, "/healthz"))[0] == 200  # still serving


def test_parse_listen() -> None:
    assert parse_listen("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen("[::1]:0") == ("::1", 0)
    assert parse_listen(":9464") == ("0.0.0.0", 9464)
    with pytest.raises(ValueError, match="expected HOST:PORT"):
        parse_listen("localhost")


TOKEN = "status-token-0123456789"


@pytest.mark.parametrize(
    ("authorization", "status"),
    [
        (None, 401),
        (f"Bearer {TOKEN}", 200),
        ("Bearer wrong-token-0123456789", 401),
        ("Basic " + base64.b64encode(f"anyone:{TOKEN}".encode()).decode(), 200),
        ("Basic " + base64.b64encode(b"anyone:wrong").decode(), 401),
        ("Basic not-base64!", 401),
        (f"Token {TOKEN}", 401),
    ],
)
async def test_a_status_token_guards_status_but_not_probes_or_metrics(
    authorization: str | None, status: int
) -> None:
    source = FakeSource()
    server = HttpServer(
        "127.0.0.1:0", registry=CollectorRegistry(), source=source, status_token=TOKEN
    )
    await server.start()
    try:
        extra = f"Authorization: {authorization}\r\n" if authorization else ""
        for target in ("/status",):
            raw = f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n{extra}\r\n".encode()
            code, headers, body = await request(server, raw)
            assert code == status, (target, authorization)
            if status == 401:
                assert headers["www-authenticate"].startswith("Basic ")
                assert b"plain" not in body  # nothing of the status document
        assert source.calls == ([] if status == 401 else source.calls)
        for target in ("/healthz", "/readyz", "/metrics"):
            assert (await get(server, target))[0] == 200
    finally:
        await server.close()


# ------------------------------------------------------------------ slow and many clients

BOUND_S = 0.5  # the request bound these servers get instead of REQUEST_S (10 s)


async def closed_by_server(reader: asyncio.StreamReader, within: float) -> bytes:
    """Everything the server sent until it closed the connection (at most ``within`` s)."""
    received = b""
    async with asyncio.timeout(within):
        while True:
            try:
                chunk = await reader.read(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk


async def dribble(writer: asyncio.StreamWriter, data: bytes) -> None:
    """Sends ``data`` a byte every 20 ms until it is all sent or the server hangs up."""
    for byte in data:
        try:
            writer.write(bytes([byte]))
            await writer.drain()
        except ConnectionError:
            return
        await asyncio.sleep(0.02)  # the pace of the attack, not a wait for the server


async def test_a_head_sent_a_byte_at_a_time_is_cut_off_after_the_bound() -> None:
    server = HttpServer(
        "127.0.0.1:0", registry=CollectorRegistry(), source=FakeSource(), request_s=BOUND_S
    )
    await server.start()
    try:
        assert server.deadlines is not None
        loop = asyncio.get_running_loop()
        reader, writer = await asyncio.open_connection(server.host, server.port)
        began = loop.time()
        # A head that would take 200 bytes x 20 ms = 4 s, eight times the bound.
        head = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 160 + b"\r\n\r\n"
        sending = asyncio.create_task(dribble(writer, head))
        # Meanwhile the replica serves others.
        assert (await get(server, "/healthz"))[0] == 200
        received = await closed_by_server(reader, within=10 * BOUND_S)
        took = loop.time() - began
        assert received == b""  # cut off: no answer to half a head
        assert BOUND_S * 0.9 <= took < 4.0, took  # at the bound, long before the head ended
        assert not sending.done() or sending.result() is None
        await sending
        writer.close()
        assert server.deadlines.cut_off == 1

        # On a kept-alive connection the next head is due within the bound of the answer.
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.readuntil(b"ok\n"), 5)
        assert answer.startswith(b"HTTP/1.1 200")
        began = loop.time()
        await dribble_until_closed(writer, reader, head)
        assert BOUND_S * 0.9 <= loop.time() - began < 4.0
        assert server.deadlines.cut_off == 2
    finally:
        await server.close()


async def dribble_until_closed(
    writer: asyncio.StreamWriter, reader: asyncio.StreamReader, head: bytes
) -> None:
    sending = asyncio.create_task(dribble(writer, head))
    try:
        assert await closed_by_server(reader, within=10 * BOUND_S) == b""
    finally:
        await sending
        writer.close()


async def test_a_body_that_does_not_arrive_within_the_bound_is_refused_and_closed() -> None:
    server = HttpServer(
        "127.0.0.1:0", registry=CollectorRegistry(), source=FakeSource(), request_s=BOUND_S
    )
    await server.start()
    try:
        reader, writer = await asyncio.open_connection(server.host, server.port)
        writer.write(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 400\r\n\r\nab")
        await writer.drain()
        sending = asyncio.create_task(dribble(writer, b"c" * 200))  # 4 s of body
        received = await closed_by_server(reader, within=10 * BOUND_S)
        await sending
        writer.close()
        assert received.startswith(b"HTTP/1.1 408"), received[:200]
        assert b"the request body took over 0.5 s" in received
        # A body that comes at once is read and answered as before.
        assert (await get(server, "/healthz"))[0] == 200
    finally:
        await server.close()


async def test_connections_past_the_most_are_turned_away_until_one_closes() -> None:
    server = HttpServer(
        "127.0.0.1:0", registry=CollectorRegistry(), source=FakeSource(), max_connections=2
    )
    await server.start()
    try:
        assert server.deadlines is not None
        held = []
        for _ in range(2):  # two kept-alive connections, each answered once: both are open
            reader, writer = await asyncio.open_connection(server.host, server.port)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            await writer.drain()
            await asyncio.wait_for(reader.readuntil(b"ok\n"), 5)
            held.append((reader, writer))
        reader, writer = await asyncio.open_connection(server.host, server.port)
        assert await closed_by_server(reader, within=5) == b""
        writer.close()
        assert server.deadlines.turned_away == 1
        held[0][1].close()

        async def served() -> bool:
            try:
                return (await get(server, "/healthz"))[0] == 200
            except (ConnectionError, IndexError, ValueError):
                return False  # turned away: the closed one is not yet counted out

        await wait_for_async(served, timeout=5, message="a connection served once one closed")
        held[1][1].close()
    finally:
        await server.close()


def test_the_bounds_must_be_positive() -> None:
    for bad in ({"request_s": 0.0}, {"request_s": -1.0}, {"max_connections": 0}):
        with pytest.raises(ValueError, match="request_s must be positive"):
            HttpServer("127.0.0.1:0", registry=CollectorRegistry(), source=FakeSource(), **bad)
