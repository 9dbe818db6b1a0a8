"""A tick (or manual trigger) on its way through a batch, the answers a batch waits for, and
the trigger messages a round of publishes sends."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from enum import IntEnum
from typing import Any, TypeVar

from hrwcron.core import events
from hrwcron.core.model import ClaimRecord, TriggerMessage, encode
from hrwcron.core.outcomes import Outcome
from hrwcron.core.ticks import TickId, format_ms
from hrwcron.engine.jobs import Job
from hrwcron.engine.ports import (
    HEADER_CE_DATACONTENTTYPE,
    HEADER_CE_ID,
    HEADER_CE_SOURCE,
    HEADER_CE_SPECVERSION,
    HEADER_CE_SUBJECT,
    HEADER_CE_TIME,
    HEADER_CE_TYPE,
    HEADER_CONTENT_TYPE,
    HEADER_DUE,
    HEADER_JOB,
    HEADER_KIND,
    HEADER_MSG_ID,
    HEADER_RUN,
    HEADER_WATERMARK,
    TickSpan,
    TriggerWrite,
)


class Flight:
    """One tick (or manual trigger) on its way through a batch."""

    __slots__ = (
        "attempt",
        "claim_key",
        "due",
        "earlier",
        "entry",
        "error",
        "expected",
        "fences",
        "job",
        "kind",
        "looked_back",
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
        # Earlier ticks not seen in the stream: 1, the subject read again; 2, their claims read.
        self.looked_back = 0
        # Earlier ticks of the job claimed by others and not in the stream: acted on first.
        self.earlier: tuple[int, ...] = ()
        self.expected = 0
        self.watermark = 0
        self.run: int | None = None  # the Hrwcron-Run header of a max_runs job's trigger
        self.span: TickSpan | None = None
        self.step_span: TickSpan | None = None
        self.outcome: Outcome | None = None
        self.error = ""


class Step(IntEnum):
    """The step of a tick's act a pending answer belongs to."""

    CREATE = 0  # the create-only claim
    READ = 1  # the claim another replica holds, read
    TAKEOVER = 2  # a silent holder's claim, replaced
    RUNS = 3  # whether the previous run still runs (overlap = "skip")
    SKIP = 4  # the claim, marked skipped
    PUBLISH = 5  # the fenced trigger publish
    LAST = 6  # the subject's last trigger, read after a fence conflict
    COUNT = 7  # a max_runs job's run count, loaded
    REJECT = 8  # the claim, marked rejected
    HELD = 9  # the subject's last trigger, read while a live holder has the claim
    EARLIER = 10  # the claims of the job's earlier ticks not seen in the stream
    AWAIT = 11  # the subject's last trigger, read while an earlier tick is still claimed


T = TypeVar("T")
# What a flight does next with a step's answer. The answer's type is the step's own (a claim's
# revision, a claim read, the subject's last trigger...): ``Batch.wait`` takes the step's
# future and its continuation together, so mypy checks at each step sent that the two agree.
Then = Callable[[Flight, T, "Batch", list[Flight]], None]


class Batch:
    """The answers a batch waits for, and a wake-up when some have come."""

    __slots__ = ("answered", "deadline", "event", "pending", "timeout", "won")

    def __init__(self, timeout: float) -> None:
        # Each answer's flight, step and continuation (None: the dispatcher handles the step
        # itself, as it does a publish, whose errors are answers too).
        self.pending: dict[asyncio.Future[Any], tuple[Flight, Step, Then[Any] | None]] = {}
        self.answered: list[asyncio.Future[Any]] = []
        self.event = asyncio.Event()
        self.timeout = timeout
        self.deadline = 0.0
        self.won: list[Flight] = []  # claims won in this round, published together

    def wait(
        self, flight: Flight, future: asyncio.Future[T], step: Step, then: Then[T] | None
    ) -> None:
        self.pending[future] = (flight, step, then)
        future.add_done_callback(self._landed)

    def sent(self) -> None:
        """Writes just went out: they get the whole timeout, even when the replica was
        paused after the previous round (its first act on waking must not be a timeout)."""
        self.deadline = asyncio.get_running_loop().time() + self.timeout

    def _landed(self, future: asyncio.Future[Any]) -> None:
        self.answered.append(future)
        self.event.set()


def cloudevents_headers(source: str) -> dict[str, str] | None:
    """The CloudEvents headers every trigger of a deployment shares, worked out once; None
    (no CloudEvents headers) for an empty ``source``."""
    if not source:
        return None
    return {
        HEADER_CE_SPECVERSION: events.SPECVERSION,
        HEADER_CE_TYPE: events.EVENT_TYPE,
        HEADER_CE_SOURCE: events.header_value(source),
        HEADER_CE_DATACONTENTTYPE: events.DATA_CONTENT_TYPE,
        HEADER_CONTENT_TYPE: events.DATA_CONTENT_TYPE,
    }


def trigger_writes(
    flights: list[Flight],
    node: str,
    now_ms: float,
    cloudevents: Mapping[str, str] | None = None,
) -> list[TriggerWrite]:
    """The trigger messages of a round of publishes, each fenced on its subject's last
    sequence; a traced flight's publish step starts here and rides in the headers. With
    ``cloudevents`` (see :func:`cloudevents_headers`) each is a CloudEvent too: its id the tick
    key, its time the due instant, its subject the job. None of the three needs escaping (job
    names, tick keys and instants are printable ASCII without space, quote or percent), so a
    tick costs three strings it already has."""
    writes: list[TriggerWrite] = []
    fired_at = format_ms(int(now_ms))
    for flight in flights:
        job = flight.job
        due = format_ms(flight.due)
        headers = {
            HEADER_MSG_ID: flight.msg_id,
            HEADER_JOB: job.spec.name,
            HEADER_DUE: due,
            HEADER_WATERMARK: str(flight.watermark),
            HEADER_KIND: flight.kind,
        }
        if flight.run is not None:
            headers[HEADER_RUN] = str(flight.run)
        if cloudevents is not None:
            headers.update(cloudevents)
            headers[HEADER_CE_ID] = flight.msg_id
            headers[HEADER_CE_TIME] = due
            headers[HEADER_CE_SUBJECT] = job.spec.name
        if flight.span is not None:
            flight.step_span = flight.span.start_child(
                f"publish {job.subject}",
                {
                    "messaging.system": "nats",
                    "messaging.destination.name": job.subject,
                    "messaging.message.id": flight.msg_id,
                    "messaging.operation.type": "publish",
                },
            )
            flight.step_span.inject(headers)
        body = encode(
            TriggerMessage(
                job=job.spec.name,
                tick=flight.msg_id,
                due=due,
                due_ms=flight.due,
                fired_at=fired_at,
                node=node,
                attempt=max(1, flight.attempt),
                payload=job.spec.payload,
                kind=flight.kind,  # type: ignore[arg-type]
            )
        )
        writes.append((job.subject, body, headers, flight.expected))
    return writes
