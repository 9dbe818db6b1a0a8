"""The replica's HTTP endpoint on aiohttp: /metrics, /healthz, /readyz and /status, plus the
routes the composition mounts (the console's pages, at /).

aiohttp parses requests, bounds their heads (line and field sizes, header count) and closes
idle keep-alive connections; this module adds the headers every answer carries, the errors a
person can read, and the status token that guards what shows job specs.
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

# Bounds on a request head (aiohttp's parser enforces them) and on idle connections.
MAX_LINE = 8 * 1024
MAX_FIELD = 8 * 1024
MAX_HEADERS = 64
KEEPALIVE_S = 15.0
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
    ) -> None:
        self.host, self.port = parse_listen(listen)
        self._registry = registry
        self._source = source
        self._token = status_token
        self._mounts = tuple(mounts)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def addresses(self) -> list[str]:
        """The addresses the listener is bound to (empty before ``start``)."""
        if self._runner is None:
            return []
        return [str(address[0]) for address in self._runner.addresses]

    def application(self) -> web.Application:
        app = web.Application(middlewares=[_plain_errors], client_max_size=64 * 1024)
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
            keepalive_timeout=KEEPALIVE_S,
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
            site = web.TCPSite(runner, self.host, self.port)
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        # Port 0 asks the OS for one; report the real one.
        self.port = int(runner.addresses[0][1])
        log.info("http endpoint at %s (/metrics, /healthz, /readyz, /status, /)", self.url)

    async def close(self) -> None:
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()

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
