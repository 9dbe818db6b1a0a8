"""Connecting to NATS: every auth method, TLS, reconnect forever, and the server version check."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nats.aio.client import Client

from hrwcron.core.config import NatsConfig, redact_url
from hrwcron.core.errors import NatsSetupError, ServerVersionError

log = logging.getLogger("hrwcron.nats")

MIN_SERVER_VERSION = (2, 11, 0)
# Retries of an unreachable server: the first after 0.25 s, each later one twice as long
# after the last, at most a second apart (a restarted server is back within a second).
FIRST_RETRY_S = 0.25
MAX_RETRY_S = 1.0
# Connection errors repeat with every retry; one line per this many seconds says how often.
ERROR_LOG_EVERY_S = 5.0


class ErrorLog:
    """Logs a repeating error at once, then at most every ``every`` seconds with a count."""

    def __init__(self, every: float = ERROR_LOG_EVERY_S, now: Any = time.monotonic) -> None:
        self._every = every
        self._now = now
        self._last: float | None = None
        self._unlogged = 0

    def error(self, message: str) -> None:
        now = self._now()
        if self._last is not None and now - self._last < self._every:
            self._unlogged += 1
            return
        repeats = f" ({self._unlogged} more since the last report)" if self._unlogged else ""
        log.warning("nats: %s%s", message, repeats)
        self._last = now
        self._unlogged = 0

    def reset(self) -> None:
        self._last = None
        self._unlogged = 0


@dataclass
class ConnectionHooks:
    """Called when the connection drops, before reconnecting: writes waiting for an answer
    on the old connection will never get one. ``refused`` keeps the server's permission
    violations: a request refused for want of permission gets no answer, only a timeout,
    and start-up must not mistake that for an election."""

    disconnected: list[Callable[[], None]] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)


# What nats-server says when it refuses a request for want of permission, and when it refuses
# the credentials themselves.
PERMISSIONS_VIOLATION = "permissions violation"
AUTHORIZATION_VIOLATION = "authorization violation"
# The newest few refusals are kept; one names the subject, which is all a reader needs.
REFUSALS_KEPT = 8


class _CredentialsRefused(Exception):
    """Raised from the error callback to end nats-py's first connect: it would otherwise
    retry refused credentials forever."""


def tls_context(options: NatsConfig) -> ssl.SSLContext | None:
    wants_tls = any(s.startswith("tls://") for s in options.servers)
    if not (options.tls_ca or options.tls_cert or wants_tls):
        return None
    context = ssl.create_default_context(cafile=options.tls_ca or None)
    if options.tls_cert:
        context.load_cert_chain(options.tls_cert, options.tls_key or None)
    return context


async def connect(
    options: NatsConfig, *, name_suffix: str = "", hooks: ConnectionHooks | None = None
) -> Client:
    """Connect with reconnect-forever and a short ping interval.

    ``pending_size=0`` makes the client refuse writes while disconnected instead of buffering
    them: a buffered claim or publish flushed after a reconnect could land long after the
    replica gave up on it. Refused writes surface as errors the engine retries deliberately.

    While the server cannot be reached, retries back off (see MAX_RETRY_S) and their errors
    are logged every few seconds with a count, not once per attempt."""
    client = Client()
    errors = ErrorLog()
    connecting = True

    async def on_error(exc: Exception) -> None:
        text = str(exc) or type(exc).__name__
        if connecting and AUTHORIZATION_VIOLATION in text.lower():
            raise _CredentialsRefused(text)
        if hooks is not None and PERMISSIONS_VIOLATION in text.lower():
            hooks.refused[:] = [*hooks.refused[-(REFUSALS_KEPT - 1) :], text]
        errors.error(text)
        if not client.is_connected:
            # nats-py reads this option before every attempt: the way to back off with it.
            wait = float(client.options.get("reconnect_time_wait", FIRST_RETRY_S))
            client.options["reconnect_time_wait"] = min(MAX_RETRY_S, wait * 2)

    async def on_disconnected() -> None:
        for hook in hooks.disconnected if hooks else ():
            try:
                hook()
            except Exception:
                log.exception("a disconnect hook failed")
        if not (client.is_closed or client.is_draining):
            log.warning("nats: disconnected")

    async def on_reconnected() -> None:
        client.options["reconnect_time_wait"] = FIRST_RETRY_S
        errors.reset()
        url = client.connected_url.geturl() if client.connected_url else "?"
        log.info("nats: reconnected to %s", redact_url(url))

    kwargs: dict[str, Any] = dict(
        servers=options.servers,
        name=options.name + name_suffix,
        connect_timeout=options.connect_timeout,
        max_reconnect_attempts=-1,
        reconnect_time_wait=FIRST_RETRY_S,
        ping_interval=2,
        max_outstanding_pings=2,
        pending_size=0,
        allow_reconnect=True,
        error_cb=on_error,
        disconnected_cb=on_disconnected,
        reconnected_cb=on_reconnected,
    )
    if options.user:
        kwargs["user"] = options.user
        kwargs["password"] = options.password or ""
    if options.token:
        kwargs["token"] = options.token
    if options.creds:
        kwargs["user_credentials"] = options.creds
    if options.nkey_seed:
        kwargs["nkeys_seed"] = options.nkey_seed
    context = tls_context(options)
    if context is not None:
        kwargs["tls"] = context
        kwargs["tls_handshake_first"] = options.tls_handshake_first
    servers = ", ".join(redact_url(s) for s in options.servers)
    try:
        await client.connect(**kwargs)
    except _CredentialsRefused as exc:
        with contextlib.suppress(Exception):
            await client.close()
        raise NatsSetupError(
            f"NATS at {servers} refused this replica's credentials ({exc}): check nats.user "
            "and password, token, creds or nkey_seed"
        ) from None
    except Exception as exc:
        reason = f"{type(exc).__name__}: {exc}"
        raise NatsSetupError(f"cannot connect to NATS at {servers}: {reason}") from None
    finally:
        connecting = False
    client.options["reconnect_time_wait"] = FIRST_RETRY_S
    try:
        check_server_version(client.connected_server_version)
    except ServerVersionError:
        await client.close()
        raise
    return client


async def drain_within(client: Client, seconds: float) -> None:
    """Drain the connection in about ``seconds``, then make sure it is closed.

    The bound is the client's own ``drain_timeout``, not a cancellation from outside:
    cancelling ``drain()`` leaves the client's gather of its subscriptions' drains with a
    CancelledError nobody retrieves, logged as a traceback when the process exits. The outer
    bound only covers the flush that follows the drain on a connection that stopped
    answering."""
    client.options["drain_timeout"] = seconds
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.drain(), seconds + 0.5)
    if not client.is_closed:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.close(), 0.5)


def check_server_version(version: Any) -> None:
    found = (int(version.major), int(version.minor), int(version.patch))
    if found < MIN_SERVER_VERSION:
        raise ServerVersionError(
            f"nats-server {'.'.join(map(str, found))} is too old: hrwcron needs "
            f"{'.'.join(map(str, MIN_SERVER_VERSION))} or newer (per-message TTL on claims)"
        )
