"""The trigger ledger: the newest trigger on every subject, as the trigger stream shows it.

A replica reads the newest trigger of every subject at start-up (holding a share with progress
marks: of its share's subjects, as it loads them), then remembers what it publishes and what it
reads; without progress marks it follows every trigger (a tick is done once its subject's
watermark reaches it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from hrwcron.engine.pacing import Slices
from hrwcron.engine.ports import LastTrigger, Observer, TriggersPort

log = logging.getLogger("hrwcron.scheduler")

# What the ledger records for a subject it read and found empty: no trigger, no watermark.
NONE_YET = LastTrigger(0, "", 0, 0)


class TriggerLedger:
    """``last[subject]``: the newest trigger seen on it; ``newer`` is told of each advance."""

    def __init__(
        self,
        triggers: TriggersPort,
        *,
        observer: Observer,
        newer: Callable[[str, LastTrigger], None],
        retry_after: float,
    ) -> None:
        self._triggers = triggers
        self._observer = observer
        self._newer = newer
        self._retry_after = retry_after
        self.last: dict[str, LastTrigger] = {}
        self.loaded = asyncio.Event()  # set once the stream's history has been read
        self.stopping = False

    def remember(self, subject: str, seen: LastTrigger) -> None:
        """Record ``seen`` on ``subject`` unless a newer trigger is known already, and tell
        ``newer`` when it was news."""
        if self.note(subject, seen):
            self._newer(subject, seen)

    def note(self, subject: str, seen: LastTrigger) -> bool:
        """Record what a read found without telling anyone (the ticks it shows are decided
        where they always are: the owner, or a follower at its turn); True when it was news."""
        known = self.last.get(subject)
        if known is not None and known.seq >= seen.seq:
            return False
        self.last[subject] = seen
        return True

    async def read(self, subjects: list[str], timeout: float) -> None:
        """Read the newest trigger of each of ``subjects``, within ``timeout``; one with none
        is recorded as such, so a job edited later is not read again."""
        found = await asyncio.wait_for(self._triggers.last_many(subjects), timeout)
        for subject in subjects:
            self.note(subject, found.get(subject, NONE_YET))

    def forget(self, subject: str) -> None:
        """The subject moved on in a way this replica did not see: read it again first."""
        self.last.pop(subject, None)

    def done(self, subject: str, due: int) -> LastTrigger | None:
        """The trigger that shows the tick due at ``due`` on ``subject`` is published."""
        last = self.last.get(subject)
        return last if last is not None and last.watermark >= due else None

    async def follow(self, *, live: bool = True) -> None:
        """Read the stream's history, then (``live``) every new trigger, until stopped.

        With progress marks a replica does not follow: it learns of its own triggers from
        their acks, and of the others' only when it reads a subject (a fence, a held claim, a
        job's status), so a trigger costs no replica but its publisher anything."""
        while not self.stopping:
            try:
                slices = Slices()
                async for item in self._triggers.follow():
                    if item is None:
                        self.loaded.set()
                        if not live:
                            return
                        continue
                    subject, seen = item
                    self.remember(subject, seen)
                    self._observer.trigger_seen(subject, seen)
                    if slices.spent():
                        await asyncio.sleep(0)
            except Exception as exc:
                log.warning("trigger feed stopped (%s); restarting it", exc)
            await asyncio.sleep(self._retry_after)
