"""The timer alone, on a hand-driven clock: due jobs are evaluated in due order, each job's
stale entries are dropped, busy or removed jobs are passed over, a herd is handed over in
bounded batches, and ticks spread a few ms apart come in batches instead of one wake-up each."""

from __future__ import annotations

import asyncio
import contextlib

from harness import wait_for_async
from harness.engine_parts import Clocks
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.core.model import JobSpec
from hrwcron.engine.clock import Clock
from hrwcron.engine.jobs import Job
from hrwcron.engine.timer import TIMER_BATCH, WAKE_SPACING_MS, Timer


def job(name: str) -> Job:
    spec = JobSpec(name=name, schedule="@every 1m")
    plan = spec.plan()
    return Job(spec, plan.schedule, plan, f"s.{name}", 0, 1, 0)


class Harness:
    def __init__(self, *names: str) -> None:
        self.clocks = Clocks()
        self.jobs = {name: job(name) for name in names}
        self.evaluated: list[tuple[str, bool]] = []
        self.batches: list[list[str]] = []
        self.is_ready = True
        self.timer: Timer[str] = Timer(
            self.jobs,
            Clock(self.clocks.wall, self.clocks.monotonic),
            ready=lambda: self.is_ready,
            evaluate=self.evaluate,
            submit=self.batches.append,
        )

    def evaluate(self, job: Job, now: float, ready: bool, acts: list[str]) -> None:
        self.evaluated.append((job.spec.name, ready))
        acts.append(job.spec.name)

    def at(self, seconds: float) -> float:
        return self.clocks.real_ms + seconds * 1000


async def running(harness: Harness) -> asyncio.Task[None]:
    return asyncio.create_task(harness.timer.run())


async def stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def test_due_jobs_are_evaluated_in_due_order_and_later_ones_wait() -> None:
    h = Harness("a", "b", "later")
    h.timer.push(h.jobs["a"], h.at(-1))
    h.timer.push(h.jobs["b"], h.at(-2))
    h.timer.push(h.jobs["later"], h.at(3600))
    task = await running(h)
    try:
        await wait_for_async(lambda: len(h.evaluated) == 2, timeout=5, message="two evaluated")
        assert h.evaluated == [("b", True), ("a", True)]
        assert h.batches == [["b", "a"]]
        h.clocks.advance(3_600_000)
        assert len(h.evaluated) == 2, "not due before its time"
        h.timer.wakeup.set()  # what the loop's own timeout would do an hour from now
        await wait_for_async(lambda: len(h.evaluated) == 3, timeout=5, message="later")
        assert h.evaluated[-1] == ("later", True)
    finally:
        await stop(task)


async def test_only_a_jobs_newest_entry_counts_and_busy_or_removed_jobs_are_passed_over() -> None:
    h = Harness("moved", "busy", "gone", "due")
    h.timer.push(h.jobs["moved"], h.at(-5))
    h.timer.push(h.jobs["moved"], h.at(3600))  # pushed again: the earlier entry is stale
    h.timer.push(h.jobs["busy"], h.at(-4))
    h.jobs["busy"].busy = True
    h.timer.push(h.jobs["gone"], h.at(-3))
    del h.jobs["gone"]
    h.timer.push(h.jobs["due"], h.at(-1))
    h.is_ready = False
    task = await running(h)
    try:
        await wait_for_async(lambda: h.evaluated, timeout=5, message="evaluated")
        await wait_for_async(lambda: len(h.timer.heap) == 1, timeout=5, message="stale dropped")
        assert h.evaluated == [("due", False)]
        assert h.timer.heap[0][2] == "moved"
    finally:
        await stop(task)


async def test_a_herd_is_handed_over_in_bounded_batches() -> None:
    names = [f"j{i:03d}" for i in range(TIMER_BATCH + 44)]
    h = Harness(*names)
    for i, name in enumerate(names):
        h.timer.push(h.jobs[name], h.at(-1) + i)
    h.clocks.advance(1000)
    task = await running(h)
    try:
        await wait_for_async(lambda: len(h.evaluated) == len(names), timeout=5, message="all")
        assert [len(batch) for batch in h.batches] == [TIMER_BATCH, 44]
        assert [name for batch in h.batches for name in batch] == names
    finally:
        await stop(task)


async def test_ticks_due_right_after_a_batch_wait_for_the_spacing_and_come_together() -> None:
    h = Harness("first", "second", "third", "after_a_quiet_spell")
    h.timer.push(h.jobs["first"], h.at(0))
    task = await running(h)
    try:
        await wait_for_async(lambda: len(h.batches) == 1, timeout=5, message="first batch")
        # Due now, but a batch has just been handed over: they wait for the spacing to pass.
        h.timer.push(h.jobs["second"], h.at(0))
        h.clocks.advance(1)
        h.timer.push(h.jobs["third"], h.at(0))
        for _ in range(20):
            await asyncio.sleep(WAKE_SPACING_MS / 4000)  # virtual time; the hand clock stays
        assert h.batches == [["first"]], "held until the spacing has passed"
        h.clocks.advance(WAKE_SPACING_MS)
        h.timer.wakeup.set()
        await wait_for_async(lambda: len(h.batches) == 2, timeout=5, message="second batch")
        assert h.batches[1] == ["second", "third"]
        # After a quiet spell a tick is handed over at its due instant, with nothing added.
        h.clocks.advance(1000)
        h.timer.push(h.jobs["after_a_quiet_spell"], h.at(0))
        await wait_for_async(lambda: len(h.batches) == 3, timeout=5, message="no spacing")
        assert h.batches[2] == ["after_a_quiet_spell"]
    finally:
        await stop(task)


def test_pushing_wakes_the_loop_only_for_a_new_earliest_entry() -> None:
    h = Harness("a", "b")
    h.timer.push(h.jobs["a"], h.at(10))
    assert h.timer.wakeup.is_set()
    h.timer.wakeup.clear()
    h.timer.push(h.jobs["b"], h.at(20))
    assert not h.timer.wakeup.is_set()
    h.timer.push(h.jobs["b"], h.at(5))
    assert h.timer.wakeup.is_set()
