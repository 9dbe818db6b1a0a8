"""Start-up that rides out a JetStream election instead of leaving it to a supervisor.

A replica started while its cluster elects leaders (a stream leader just killed, a cluster
booting after an outage, a server whose JetStream is still recovering) meets errors that go
away by themselves: no responders, "temporarily unavailable", requests that time out, a bucket
whose stream has no leader yet. :func:`start_with_retries` tries the whole start again, from a
fresh connection, after 0.25 s, then twice as long each time up to 5 s, and starts no attempt
later than ``scheduler.startup_timeout`` after the first. The first such error is logged once,
and one line says how it ended (started after N attempts, or gave up with the last error).

What no retry can change ends the start at once: whatever hrwcron itself refuses (a bucket or
stream that contradicts the settings, a server too old, a node id a live replica uses, a config
the server cannot carry), credentials the server refused, a request refused for want of
permission (which the server answers with an error on the connection and no reply, so the
request times out: :class:`~hrwcron.adapters.jetstream.connect.ConnectionHooks` keeps the
refusal), and JetStream answers that describe the account or the cluster rather than a moment.

An unreachable server is not counted here: the client waits for it forever, as it does for a
running replica (see ``adapters/jetstream/connect.py``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from nats.errors import Error as NatsError
from nats.js.errors import APIError

from hrwcron.core.errors import HrwcronError, NatsSetupError
from hrwcron.engine.ports import StoreUnavailable

log = logging.getLogger("hrwcron.app")

T = TypeVar("T")

FIRST_WAIT_S = 0.25
MAX_WAIT_S = 5.0
# JetStream answers about the account or the cluster's shape, not about a moment of it.
PERMANENT_ANSWERS = (
    "not enabled for account",
    "not supported in non-clustered mode",
)


def transient(exc: BaseException) -> bool:
    """Whether ``exc`` at start-up may go away by itself (an election, a booting cluster)."""
    if isinstance(exc, StoreUnavailable):
        return True
    if isinstance(exc, HrwcronError):
        return False
    if isinstance(exc, APIError):
        answer = (exc.description or "").lower()
        return not any(text in answer for text in PERMANENT_ANSWERS)
    return isinstance(exc, NatsError | TimeoutError | OSError)


def refused(exc: BaseException, refusals: Sequence[str]) -> NatsSetupError | None:
    """The error to end with when a request of this start got no answer because the server
    refused it for want of permission (``refusals``: what it said on the connection)."""
    if not refusals or not transient(exc):
        return None
    return NatsSetupError(
        f"NATS refused a request of this replica: {refusals[-1]}; give its user the "
        "scheduler role's permissions (nats/accounts.conf)"
    )


def describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def start_with_retries(
    attempt: Callable[[], Awaitable[T]],
    *,
    bound_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> T:
    """``attempt()`` until it succeeds or raises what no retry can change; a transient error
    past ``bound_s`` becomes a NatsSetupError saying how long and how often it was tried.
    ``attempt`` must leave nothing behind when it raises (connection closed, tasks stopped)."""
    began = monotonic()
    wait = FIRST_WAIT_S
    attempts = 0
    while True:
        attempts += 1
        try:
            result = await attempt()
        except Exception as exc:
            if not transient(exc):
                raise
            spent = monotonic() - began
            if spent >= bound_s:
                raise NatsSetupError(
                    f"NATS did not serve JetStream within {bound_s:g} s ({attempts} attempts; "
                    f"last: {describe(exc)}); is JetStream enabled and its cluster up?"
                ) from exc
            if attempts == 1:
                log.warning(
                    "start-up: JetStream is not serving yet (%s); retrying for up to %g s",
                    describe(exc),
                    bound_s,
                )
            await sleep(min(wait, bound_s - spent))
            wait = min(MAX_WAIT_S, wait * 2)
            continue
        if attempts > 1:
            log.info(
                "start-up: JetStream served after %d attempts in %.1f s",
                attempts,
                monotonic() - began,
            )
        return result
