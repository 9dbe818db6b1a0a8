"""A small HTTP/1.1 server on asyncio streams: /metrics, /healthz, /readyz, /status and a
read-only status page at /.

No framework: five read-only routes do not need one, and every dependency is one more thing to
patch in a process whose only job is firing ticks on time. One request per connection; request
heads are bounded in size and time so a slow or hostile client cannot hold resources.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any, Protocol
from urllib.parse import parse_qs, urlsplit

import msgspec
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from hrwcron.adapters.status_page import MAX_LIMIT, PAGE_CSP, render_page

log = logging.getLogger("hrwcron.http")

MAX_HEAD = 16 * 1024
HEAD_TIMEOUT = 10.0
WRITE_TIMEOUT = 10.0
DEFAULT_LIMIT = 100


class StatusSource(Protocol):
    def not_ready_reason(self) -> str: ...
    async def status(
        self, limit: int, timeline: bool, *, prefix: str = "", after: str = ""
    ) -> dict[str, Any]:
        """Raises ValueError for an ``after`` that is no page's ``next``."""
        ...


class BadRequest(Exception):
    pass


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` as (host, port); raises ValueError naming the problem."""
    host, colon, port = listen.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"http.listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def _limit(query: dict[str, list[str]]) -> int:
    values = query.get("limit")
    if not values:
        return DEFAULT_LIMIT
    text = values[-1]
    if not text.isdigit() or not 1 <= int(text) <= MAX_LIMIT:
        raise BadRequest(f"limit must be an integer from 1 to {MAX_LIMIT}, got {text[:40]!r}")
    return int(text)


def _text_param(query: dict[str, list[str]], name: str) -> str:
    values = query.get(name)
    if not values:
        return ""
    if len(values[-1]) > 1024:
        raise BadRequest(f"{name} is longer than 1024 characters")
    return values[-1]


class Response:
    __slots__ = ("body", "headers", "status")

    def __init__(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.status = status
        self.body = body
        self.headers = {"Content-Type": content_type, **(headers or {})}


def _json(status: int, data: Any) -> Response:
    # msgspec encodes a status document of 10,000 jobs several times faster than json: the
    # event loop that fires ticks waits for the encoding.
    return Response(status, msgspec.json.encode(data), "application/json")


def _text(status: int, text: str) -> Response:
    return Response(status, text.encode(), "text/plain; charset=utf-8")


# What shows job specs and payload previews; the probes and /metrics stay open.
GUARDED = frozenset({"/", "/status"})


class HttpServer:
    """Serves one replica's endpoints; ``start`` binds, ``close`` stops it and its requests."""

    def __init__(
        self,
        listen: str,
        *,
        registry: CollectorRegistry,
        source: StatusSource,
        status_token: str | None = None,
    ) -> None:
        self.host, self.port = parse_listen(listen)
        self._registry = registry
        self._source = source
        self._token = status_token
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._routes: dict[str, Callable[[dict[str, list[str]]], Awaitable[Response]]] = {
            "/": self._page,
            "/metrics": self._metrics,
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/status": self._status,
        }

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, self.host, self.port, limit=MAX_HEAD
        )
        # Port 0 asks the OS for one; report the real one.
        self.port = int(self._server.sockets[0].getsockname()[1])
        log.info("http endpoint at %s (/metrics, /healthz, /readyz, /status, /)", self.url)

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._handlers):
            task.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 1.0)
        self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            response, head_only = await self._respond(reader)
            await self._write(writer, response, head_only)
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except Exception:
            log.exception("http request failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)
            if task is not None:
                self._handlers.discard(task)

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[Response, bool]:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT)
        except asyncio.LimitOverrunError:
            return _text(431, "request head too large\n"), False
        request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = request_line.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return _text(400, "malformed request line\n"), False
        method, target, _ = parts
        if method not in ("GET", "HEAD"):
            response = _text(405, "only GET and HEAD\n")
            response.headers["Allow"] = "GET, HEAD"
            return response, False
        url = urlsplit(target)
        route = self._routes.get(url.path)
        if route is None:
            return _text(404, "not found; try /, /status, /metrics, /healthz or /readyz\n"), False
        if url.path in GUARDED and not self._authorized(head):
            response = _text(401, "the status page needs http.status_token: sign in with it\n")
            response.headers["WWW-Authenticate"] = 'Basic realm="hrwcron status", charset="UTF-8"'
            return response, method == "HEAD"
        try:
            return await route(parse_qs(url.query)), method == "HEAD"
        except BadRequest as exc:
            return _json(400, {"error": str(exc)}), method == "HEAD"

    def _authorized(self, head: bytes) -> bool:
        """Whether the request presents the status token: as a Bearer token, or as the
        password of HTTP Basic (any user name), which a browser asks for by itself."""
        if self._token is None:
            return True
        wanted = self._token.encode()
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() != b"authorization":
                continue
            scheme, _, credentials = value.strip().partition(b" ")
            if scheme.lower() == b"bearer":
                given = credentials.strip()
            elif scheme.lower() == b"basic":
                try:
                    given = base64.b64decode(credentials.strip(), validate=True).partition(b":")[2]
                except (binascii.Error, ValueError):
                    return False
            else:
                return False
            return hmac.compare_digest(given, wanted)
        return False

    async def _write(
        self, writer: asyncio.StreamWriter, response: Response, head_only: bool
    ) -> None:
        reason = HTTPStatus(response.status).phrase
        headers = {
            **response.headers,
            "Content-Length": str(len(response.body)),
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
            "Connection": "close",
        }
        lines = [f"HTTP/1.1 {response.status} {reason}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        if not head_only:
            writer.write(response.body)
        await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT)

    # --------------------------------------------------------------------------- routes

    async def _metrics(self, query: dict[str, list[str]]) -> Response:
        # Rendering a large registry takes a while; a thread keeps the tick loop running.
        body = await asyncio.to_thread(generate_latest, self._registry)
        return Response(200, body, CONTENT_TYPE_LATEST)

    async def _healthz(self, query: dict[str, list[str]]) -> Response:
        return _text(200, "ok\n")

    async def _readyz(self, query: dict[str, list[str]]) -> Response:
        reason = self._source.not_ready_reason()
        if reason:
            return _json(503, {"ready": False, "reason": reason})
        return _json(200, {"ready": True})

    async def _read_status(self, query: dict[str, list[str]], timeline: bool) -> dict[str, Any]:
        try:
            return await self._source.status(
                _limit(query),
                timeline,
                prefix=_text_param(query, "prefix"),
                after=_text_param(query, "after"),
            )
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    async def _status(self, query: dict[str, list[str]]) -> Response:
        timeline = query.get("timeline", ["0"])[-1] in ("1", "true", "yes")
        return _json(200, await self._read_status(query, timeline))

    async def _page(self, query: dict[str, list[str]]) -> Response:
        status = await self._read_status(query, True)
        return Response(
            200,
            render_page(status).encode(),
            "text/html; charset=utf-8",
            {
                "Content-Security-Policy": PAGE_CSP,
                "X-Frame-Options": "DENY",
                "Referrer-Policy": "no-referrer",
            },
        )
