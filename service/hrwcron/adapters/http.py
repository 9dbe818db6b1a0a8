"""The replica's HTTP endpoint on aiohttp: /metrics, /healthz, /readyz and /status, plus the
routes the composition mounts (the console's pages, at /).

aiohttp parses requests and bounds their heads in size (line and field sizes, header count);
this module bounds them in time and in number, which aiohttp does not: a connection has
REQUEST_S from when it opens, or from its last answer, to deliver a whole request head (a
client that sends one a byte at a time is cut off, as is one that sends nothing), and a
request's body has REQUEST_S more; at most MAX_CONNECTIONS are open at once (the ones past it
are closed as they arrive). It adds the headers every answer carries, the errors a person can
read, and the status token that guards what shows job specs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("hrwcron.http")

# Bounds on a request head's size (aiohttp's parser enforces them).
MAX_LINE = 8 * 1024
MAX_FIELD = 8 * 1024
MAX_HEADERS = 64
# How long a connection may take to deliver a request head (from when it opens or from its
# last answer: this is also how long an idle keep-alive connection stays open), and then its
# body. A page's request takes milliseconds; a client that dribbles its head is cut off.
REQUEST_S = 10.0
# Connections open at once (a replica serves at most 100 event streams, console/events.py).
MAX_CONNECTIONS = 512
DEFAULT_LIMIT = 100
# The most jobs one /status lists (its ``next`` leads to the following ones).
MAX_LIMIT = 10_000
NOT_FOUND = "not found; try /, /jobs, /status, /metrics, /healthz or /readyz\n"

# aiohttp logs every malformed request with a traceback at ERROR: a client could fill the
# replica's log with them. The answer (400) says enough; this logger keeps only the critical.
_PROTOCOL_LOG = logging.Logger("hrwcron.http.protocol", logging.CRITICAL)

Mount = Callable[[web.Application], None]
"""Adds routes to the application before it starts (the console's pages, say)."""


class StatusSource(Protocol):
    def not_ready_reason(self) -> str: ...
    async def status(
        self, limit: int, timeline: bool, *, prefix: str = "", after: str = ""
    ) -> dict[str, Any]:
        """Raises ValueError for an ``after`` that is no page's ``next``."""
        ...


class BadRequest(Exception):
    pass


class Deadlines:
    """Closes a connection that has not delivered a request head within ``seconds`` of
    opening or of its last answer, and refuses connections past ``most`` open ones.

    aiohttp's server has no such bound of its own (its keep-alive timer is not a contract);
    this wraps its protocol factory (``web.Server`` is one, as for ``loop.create_server``)
    and is told by a middleware when a request head has arrived and when its answer is done.
    """

    def __init__(self, server: web.Server, seconds: float, most: int) -> None:
        self._server = server
        self._seconds = seconds
        self._most = most
        self._loop = asyncio.get_running_loop()
        self._timers: dict[asyncio.BaseProtocol, asyncio.TimerHandle] = {}
        self.cut_off = 0  # connections closed for taking too long over a request head
        self.turned_away = 0  # connections closed on arrival, past ``most``

    def __call__(self) -> asyncio.BaseProtocol:
        """A protocol for a new connection (asyncio calls this as it accepts one)."""
        if len(self._server.connections) >= self._most:
            self.turned_away += 1
            return _TurnAway()
        handler = self._server()
        self.arm(handler)
        return handler

    def arm(self, connection: asyncio.BaseProtocol) -> None:
        """The next request head is due within the bound."""
        self.disarm(connection)
        self._timers[connection] = self._loop.call_later(self._seconds, self._due, connection)

    def disarm(self, connection: asyncio.BaseProtocol) -> None:
        timer = self._timers.pop(connection, None)
        if timer is not None:
            timer.cancel()

    def _due(self, connection: asyncio.BaseProtocol) -> None:
        self._timers.pop(connection, None)
        if isinstance(connection, web.RequestHandler) and connection.transport is not None:
            self.cut_off += 1
            connection.force_close()

    def close(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()


class _TurnAway(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6]:PORT`` as (host, port); raises ValueError naming the problem."""
    host, colon, port = listen.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"http.listen {listen!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host or "0.0.0.0", int(port)


def query_limit(request: web.Request, default: int = DEFAULT_LIMIT, most: int = MAX_LIMIT) -> int:
    values = request.query.getall("limit", [])
    if not values:
        return default
    text = values[-1]
    if not text.isdigit() or not 1 <= int(text) <= most:
        raise BadRequest(f"limit must be an integer from 1 to {most}, got {text[:40]!r}")
    return int(text)


def query_text(request: web.Request, name: str, longest: int = 1024) -> str:
    values = request.query.getall(name, [])
    if not values:
        return ""
    if len(values[-1]) > longest:
        raise BadRequest(f"{name} is longer than {longest} characters")
    return values[-1]


def json_response(status: int, data: Any) -> web.Response:
    # msgspec encodes a status document of 10,000 jobs several times faster than json: the
    # event loop that fires ticks waits for the encoding.
    return web.Response(
        status=status, body=msgspec.json.encode(data), content_type="application/json"
    )


def text_response(status: int, text: str) -> web.Response:
    return web.Response(status=status, text=text, content_type="text/plain", charset="utf-8")


def token_presented(request: web.BaseRequest, token: str) -> bool:
    """Whether the request presents ``token``: as a Bearer token, or as the password of HTTP
    Basic (any user name), which a browser asks for by itself."""
    header = request.headers.get("Authorization", "")
    scheme, _, credentials = header.strip().partition(" ")
    if scheme.lower() == "bearer":
        given = credentials.strip().encode()
    elif scheme.lower() == "basic":
        try:
            given = base64.b64decode(credentials.strip(), validate=True).partition(b":")[2]
        except (binascii.Error, ValueError):
            return False
    else:
        return False
    return hmac.compare_digest(given, token.encode())


def page_headers(csp: str) -> dict[str, str]:
    """What every HTML answer carries: its policy, and no framing or referrers."""
    return {
        "Content-Security-Policy": csp,
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
    }


def _bounded(deadlines: Callable[[], Deadlines | None], seconds: float) -> Any:
    """The middleware that tells ``Deadlines`` a request head arrived (and its answer is
    done), and bounds how long the request's body may take to arrive."""

    @web.middleware
    async def bounded(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        watch = deadlines()
        connection = request.protocol
        if watch is not None:
            watch.disarm(connection)
        try:
            if request.body_exists:
                try:
                    async with asyncio.timeout(seconds):
                        await request.read()  # kept by the request for post() and json()
                except TimeoutError:
                    response = text_response(408, f"the request body took over {seconds:g} s\n")
                    response.force_close()
                    return response
            return await handler(request)
        finally:
            if watch is not None:
                watch.arm(connection)

    return bounded


@web.middleware
async def _plain_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Errors a person can read, and the headers every answer carries."""
    try:
        response = await handler(request)
    except BadRequest as exc:
        response = json_response(400, {"error": str(exc)})
    except web.HTTPMethodNotAllowed as exc:
        allowed = ", ".join(sorted(exc.allowed_methods))
        response = text_response(405, f"only {allowed.replace(', ', ' and ')}\n")
        response.headers["Allow"] = allowed
    except web.HTTPNotFound:
        response = text_response(404, NOT_FOUND)
    except web.HTTPException:
        raise
    except (ConnectionError, asyncio.CancelledError):
        raise
    except Exception:
        log.exception("http request %s %s failed", request.method, request.path)
        response = text_response(500, "internal error; the replica's log says more\n")
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers["X-Content-Type-Options"] = "nosniff"
    return response


class HttpServer:
    """Serves one replica's endpoints; ``start`` binds, ``close`` stops it and its requests."""

    def __init__(
        self,
        listen: str,
        *,
        registry: CollectorRegistry,
        source: StatusSource,
        status_token: str | None = None,
        mounts: Sequence[Mount] = (),
        request_s: float = REQUEST_S,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        """``request_s`` and ``max_connections`` are REQUEST_S and MAX_CONNECTIONS but in
        tests, which cannot wait ten seconds for a bound."""
        if not request_s > 0 or max_connections < 1:
            raise ValueError("request_s must be positive and max_connections at least 1")
        self.host, self.port = parse_listen(listen)
        self._request_s = request_s
        self._max_connections = max_connections
        self._registry = registry
        self._source = source
        self._token = status_token
        self._mounts = tuple(mounts)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.deadlines: Deadlines | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def addresses(self) -> list[str]:
        """The addresses the listener is bound to (empty before ``start``)."""
        if self._listener is None:
            return []
        return [str(sock.getsockname()[0]) for sock in self._listener.sockets]

    def application(self) -> web.Application:
        bounded = _bounded(lambda: self.deadlines, self._request_s)
        app = web.Application(middlewares=[bounded, _plain_errors], client_max_size=64 * 1024)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/status", self._status)
        for mount in self._mounts:
            mount(app)
        return app

    async def start(self) -> None:
        runner = web.AppRunner(
            self.application(),
            handle_signals=False,
            access_log=None,
            # aiohttp's own idle timer, a backstop behind the deadlines (which close first).
            keepalive_timeout=2 * self._request_s,
            max_line_size=MAX_LINE,
            max_field_size=MAX_FIELD,
            max_headers=MAX_HEADERS,
            logger=_PROTOCOL_LOG,
            # Requests still running get this long once the listener closed (a replica's stop
            # gives the endpoint half a second).
            shutdown_timeout=0.25,
        )
        await runner.setup()
        try:
            assert runner.server is not None
            deadlines = Deadlines(runner.server, self._request_s, self._max_connections)
            # What TCPSite does, with the factory that keeps the deadlines.
            loop = asyncio.get_running_loop()
            self._listener = await loop.create_server(
                deadlines, self.host, self.port, backlog=128, reuse_address=True
            )
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.deadlines = deadlines
        # Port 0 asks the OS for one; report the real one.
        self.port = int(self._listener.sockets[0].getsockname()[1])
        log.info("http endpoint at %s (/metrics, /healthz, /readyz, /status, /)", self.url)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        if runner is not None:
            await runner.cleanup()
        if self.deadlines is not None:
            self.deadlines.close()

    def allowed(self, request: web.BaseRequest) -> bool:
        """Whether ``request`` may read what the status token guards."""
        return self._token is None or token_presented(request, self._token)

    def refuse(self) -> web.Response:
        response = text_response(401, "/status needs http.status_token: present it\n")
        response.headers["WWW-Authenticate"] = 'Basic realm="hrwcron status", charset="UTF-8"'
        return response

    # --------------------------------------------------------------------------- routes

    async def _metrics(self, request: web.Request) -> web.Response:
        # Rendering a large registry takes a while; a thread keeps the tick loop running.
        body = await asyncio.to_thread(generate_latest, self._registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return text_response(200, "ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        reason = self._source.not_ready_reason()
        if reason:
            return json_response(503, {"ready": False, "reason": reason})
        return json_response(200, {"ready": True})

    async def _read_status(self, request: web.Request, timeline: bool) -> dict[str, Any]:
        limit = query_limit(request)
        prefix = query_text(request, "prefix")
        after = query_text(request, "after")
        try:
            return await self._source.status(limit, timeline, prefix=prefix, after=after)
        except ValueError as exc:
            raise BadRequest(str(exc)) from None

    async def _status(self, request: web.Request) -> web.Response:
        if not self.allowed(request):
            return self.refuse()
        timeline = request.query.getall("timeline", ["0"])[-1] in ("1", "true", "yes")
        return json_response(200, await self._read_status(request, timeline))
