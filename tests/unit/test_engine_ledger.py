"""The trigger ledger alone, on the in-memory trigger stream: it keeps the newest trigger per
subject, tells its listener of each advance only, and says which ticks are published."""

from __future__ import annotations

import asyncio
import contextlib

from harness import wait_for_async
from harness.virtual_time import event_loop_policy, virtual_clock  # noqa: F401
from hrwcron.adapters.memory import MemoryTriggers
from hrwcron.engine.ledger import TriggerLedger
from hrwcron.engine.ports import HEADER_MSG_ID, HEADER_WATERMARK, LastTrigger, NullObserver


def ledger_on(triggers: MemoryTriggers) -> tuple[TriggerLedger, list[tuple[str, LastTrigger]]]:
    told: list[tuple[str, LastTrigger]] = []
    ledger = TriggerLedger(
        triggers,
        observer=NullObserver(),
        newer=lambda subject, seen: told.append((subject, seen)),
        retry_after=0.05,
    )
    return ledger, told


def test_only_a_newer_trigger_replaces_the_known_one_and_is_told() -> None:
    ledger, told = ledger_on(MemoryTriggers())
    ledger.remember("s", LastTrigger(5, "a", 1000))
    ledger.remember("s", LastTrigger(3, "old", 500))  # an older message read late
    ledger.remember("s", LastTrigger(5, "a", 1000))  # the same one again
    assert ledger.last["s"] == LastTrigger(5, "a", 1000)
    assert told == [("s", LastTrigger(5, "a", 1000))]
    ledger.remember("s", LastTrigger(6, "b", 2000))
    assert told[-1] == ("s", LastTrigger(6, "b", 2000))


def test_a_tick_is_done_once_its_subject_watermark_reaches_it() -> None:
    ledger, _ = ledger_on(MemoryTriggers())
    assert ledger.done("s", 1000) is None
    ledger.remember("s", LastTrigger(1, "a", 1000))
    assert ledger.done("s", 1000) == LastTrigger(1, "a", 1000)
    assert ledger.done("s", 999) is not None
    assert ledger.done("s", 1001) is None
    assert ledger.done("other", 1) is None
    ledger.forget("s")
    assert ledger.done("s", 1000) is None


async def publish(triggers: MemoryTriggers, subject: str, msg_id: str, watermark: int) -> None:
    headers = {HEADER_MSG_ID: msg_id, HEADER_WATERMARK: str(watermark)}
    last = await triggers.last(subject)
    await triggers.publish(subject, b"{}", headers, last.seq if last else 0)


async def test_following_reads_the_history_then_every_new_trigger() -> None:
    triggers = MemoryTriggers()
    await publish(triggers, "a", "a:1", 1000)
    await publish(triggers, "b", "b:1", 1000)
    await publish(triggers, "a", "a:2", 2000)
    ledger, told = ledger_on(triggers)
    follower = asyncio.create_task(ledger.follow())
    try:
        await wait_for_async(ledger.loaded.is_set, timeout=5, message="history loaded")
        assert ledger.last["a"].msg_id == "a:2"
        assert ledger.last["b"].msg_id == "b:1"
        await publish(triggers, "b", "b:2", 2000)
        await wait_for_async(lambda: ledger.last["b"].msg_id == "b:2", timeout=5)
        assert [seen.msg_id for subject, seen in told if subject == "b"] == ["b:1", "b:2"]
    finally:
        ledger.stopping = True
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
