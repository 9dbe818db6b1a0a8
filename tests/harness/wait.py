"""Deadline-bounded polling: the only sanctioned way for tests to wait on a condition.

Sleeping a fixed time hides races on a fast machine and flakes on a slow one; polling a
predicate until a deadline does neither, and the failure says what was being waited for.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["wait_for", "wait_for_async"]


def _describe(message: str, timeout: float, last_error: BaseException | None) -> str:
    text = f"timed out after {timeout:.1f}s waiting for: {message}"
    if last_error is not None:
        text += f" (last error: {type(last_error).__name__}: {last_error})"
    return text


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Call ``predicate`` until it returns something truthy and return that value.

    Exceptions listed in ``ignore`` count as "not yet" (e.g. a connection refused while a
    server restarts); the last one is quoted in the AssertionError raised at the deadline.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            result = predicate()
        except ignore as exc:
            last_error = exc
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            raise AssertionError(_describe(message, timeout, last_error))
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))


async def wait_for_async(
    predicate: Callable[[], Awaitable[T] | T],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "condition",
    *,
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Async twin of :func:`wait_for`; ``predicate`` may be sync or return an awaitable.

    Each awaited call is itself bounded by the remaining time, so a predicate that hangs
    (a request to a stalled server) cannot stretch the deadline.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value: Any = predicate()
            if inspect.isawaitable(value):
                remaining = max(0.001, deadline - time.monotonic())
                value = await asyncio.wait_for(_as_coroutine(value), remaining)
        except TimeoutError as exc:
            if time.monotonic() >= deadline:
                raise AssertionError(_describe(message, timeout, exc)) from None
            if not issubclass(TimeoutError, ignore):
                raise
            last_error = exc
        except ignore as exc:
            last_error = exc
        else:
            if value:
                return value  # type: ignore[no-any-return]
        if time.monotonic() >= deadline:
            raise AssertionError(_describe(message, timeout, last_error))
        await asyncio.sleep(min(interval, max(0.0, deadline - time.monotonic())))


async def _as_coroutine(awaitable: Awaitable[T]) -> T:
    return await awaitable
