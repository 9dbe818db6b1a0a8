"""A tick (or manual trigger) on its way through a batch, and the answers a batch waits for."""

from __future__ import annotations

import asyncio
from typing import Any

from hrwcron.core.model import ClaimRecord
from hrwcron.core.ticks import TickId
from hrwcron.engine.jobs import Job
from hrwcron.engine.ports import TickSpan


class Flight:
    """One tick (or manual trigger) on its way through a batch."""

    __slots__ = (
        "attempt",
        "claim_key",
        "due",
        "entry",
        "error",
        "expected",
        "fences",
        "job",
        "kind",
        "msg_id",
        "outcome",
        "rank",
        "record",
        "revision",
        "run",
        "span",
        "step_span",
        "watermark",
    )

    def __init__(
        self,
        job: Job,
        entry: int,
        due: int,
        rank: int,
        kind: str = "scheduled",
        msg_id: str = "",
        claim_key: str = "",
    ) -> None:
        self.job = job
        self.entry = entry
        self.due = due
        self.rank = rank
        self.kind = kind
        if not msg_id or not claim_key:
            tick = TickId(job.spec.name, due)
            msg_id, claim_key = msg_id or tick.key, claim_key or tick.claim_key
        self.msg_id = msg_id
        self.claim_key = claim_key
        self.record: ClaimRecord | None = None
        self.revision = 0
        self.attempt = 0
        self.fences = 0
        self.expected = 0
        self.watermark = 0
        self.run: int | None = None  # the Hrwcron-Run header of a max_runs job's trigger
        self.span: TickSpan | None = None
        self.step_span: TickSpan | None = None
        self.outcome = ""
        self.error = ""


# The step a pending answer belongs to.
CREATE, READ, TAKEOVER, RUNS, SKIP, PUBLISH, LAST, COUNT, REJECT = range(9)


class Batch:
    """The answers a batch waits for, and a wake-up when some have come."""

    __slots__ = ("answered", "deadline", "event", "pending", "timeout")

    def __init__(self, timeout: float) -> None:
        self.pending: dict[asyncio.Future[Any], tuple[Flight, int]] = {}
        self.answered: list[asyncio.Future[Any]] = []
        self.event = asyncio.Event()
        self.timeout = timeout
        self.deadline = 0.0

    def wait(self, flight: Flight, future: asyncio.Future[Any], step: int) -> None:
        self.pending[future] = (flight, step)
        future.add_done_callback(self._landed)

    def sent(self) -> None:
        """Writes just went out: they get the whole timeout, even when the replica was
        paused after the previous round (its first act on waking must not be a timeout)."""
        self.deadline = asyncio.get_running_loop().time() + self.timeout

    def _landed(self, future: asyncio.Future[Any]) -> None:
        self.answered.append(future)
        self.event.set()
