"""Virtual time for tests of the engine on the in-memory stores: an event loop whose clock
moves only when every task waits, straight to the next timer, and the time module's wall and
monotonic clocks moved with it.

A failover step, a lease or a member's TTL then costs no real time, and what the engine does
at an instant happens exactly then, whatever the machine's load: a test that needs five ticks
of a job due every second takes as long as its code takes to run, not five seconds. Only code
that reads ``time.time`` or ``time.monotonic`` when it runs sees virtual time (the engine's
``Clock`` and the memory stores do); nothing here waits for real I/O, which the in-memory
stores have none of.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

# Virtual time starts here in wall-clock terms, on a whole second with the process's real date,
# so schedules see an ordinary instant.
_REAL_TIME = time.time
_REAL_MONOTONIC = time.monotonic


class VirtualClock:
    def __init__(self) -> None:
        self.wall_start = float(int(_REAL_TIME())) + 0.25
        self.now = 1_000.0  # virtual monotonic seconds

    def time(self) -> float:
        return self.wall_start + (self.now - 1_000.0)

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self.now += seconds


class _Selector(selectors.DefaultSelector):
    """Never blocks while a timer is pending: the time until it passes virtually instead."""

    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self._clock = clock

    def select(self, timeout: float | None = None) -> list[Any]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            return super().select(None)  # nothing scheduled: only real I/O can wake the loop
        self._clock.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self, clock: VirtualClock) -> None:
        self.clock = clock
        super().__init__(_Selector(clock))

    def time(self) -> float:
        return self.clock.now


class VirtualTimePolicy(asyncio.DefaultEventLoopPolicy):
    def __init__(self, clock: VirtualClock) -> None:
        super().__init__()
        self.clock = clock

    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return VirtualTimeLoop(self.clock)


@contextmanager
def virtual_time(monkeypatch: pytest.MonkeyPatch) -> Iterator[VirtualClock]:
    """Install virtual time for one test: its event loop policy and the time module."""
    clock = VirtualClock()
    monkeypatch.setattr(time, "time", clock.time)
    monkeypatch.setattr(time, "monotonic", clock.monotonic)
    yield clock


# Fixtures for a test module to import: ``from harness.virtual_time import event_loop_policy,
# virtual_clock``. Every test of that module then runs on virtual time.


@pytest.fixture(autouse=True)
def virtual_clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[VirtualClock]:
    """Autouse, so a synchronous test that runs ``asyncio.run`` gets the virtual loop too:
    the time module is virtual for every test of the module, and must move."""
    with virtual_time(monkeypatch) as clock:
        previous = asyncio.get_event_loop_policy()
        asyncio.set_event_loop_policy(VirtualTimePolicy(clock))
        try:
            yield clock
        finally:
            asyncio.set_event_loop_policy(previous)


@pytest.fixture
def event_loop_policy(virtual_clock: VirtualClock) -> VirtualTimePolicy:
    return VirtualTimePolicy(virtual_clock)
