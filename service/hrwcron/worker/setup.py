"""How a worker binds to its stream and durable consumer: the consumer created when missing,
an existing one checked against what the worker promises, and its ``ack_wait`` and
``max_deliver`` taken, since those are what the server applies."""

from __future__ import annotations

import logging

from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    StreamInfo,
)
from nats.js.errors import NotFoundError, ServiceUnavailableError

from hrwcron.worker.errors import WorkerSetupError

log = logging.getLogger("hrwcron.worker")


class ConsumerSetup:
    """The consumer checks of :class:`~hrwcron.worker.consumer.Worker`, which sets these."""

    _js: JetStreamContext
    stream: str
    durable: str
    subjects: list[str]
    ack_wait: float
    max_deliver: int
    heartbeat: float
    concurrency: int
    deliver_new: bool

    async def _stream_info(self) -> StreamInfo:
        try:
            return await self._js.stream_info(self.stream)
        except NotFoundError:
            raise WorkerSetupError(
                f"stream {self.stream} does not exist: start an hrwcron replica or run "
                "`hrwcron provision` first"
            ) from None

    async def _ensure_consumer(self) -> ConsumerInfo:
        try:
            existing: ConsumerInfo = await self._js.consumer_info(self.stream, self.durable)
        except NotFoundError:
            pass
        else:
            return existing
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait,
            max_deliver=self.max_deliver,
            max_ack_pending=max(1000, 4 * self.concurrency),
            deliver_policy=DeliverPolicy.NEW if self.deliver_new else DeliverPolicy.ALL,
            description="hrwcron worker",
        )
        if len(self.subjects) == 1:
            config.filter_subject = self.subjects[0]
        else:
            config.filter_subjects = self.subjects
        try:
            created: ConsumerInfo = await self._js.add_consumer(self.stream, config=config)
        except (NoRespondersError, ServiceUnavailableError, NatsTimeoutError) as exc:
            # With the shipped accounts a worker may not create consumers (its delivery
            # subject would be written inside the scheduler's account): an operator does.
            raise WorkerSetupError(
                f"consumer {self.durable} does not exist on stream {self.stream}, and this "
                f"connection may not create it ({type(exc).__name__}): create it with the "
                f"scheduler role, `hrwcron provision --worker-group {self.durable}"
                f"{''.join(f' --worker-subject {s}' for s in self.subjects)}`"
            ) from None
        return created

    def _adopt(self, info: ConsumerInfo) -> None:
        """Refuse a consumer this worker cannot serve safely; take its ``ack_wait`` and
        ``max_deliver``, since those are what the server applies."""
        config = info.config
        problems: list[str] = []
        if config.deliver_subject:
            problems.append("is a push consumer; the worker pulls, so give it another durable")
        if config.ack_policy not in (None, AckPolicy.EXPLICIT):
            problems.append(f"acks {config.ack_policy}; the worker needs explicit acks")
        ack_wait = config.ack_wait or 30.0  # the server's default
        if self.heartbeat > ack_wait / 2:
            problems.append(
                f"has ack_wait {ack_wait:g} s, too short for heartbeat {self.heartbeat:g} s: a "
                "running trigger would be redelivered and run again. Pass heartbeat <= "
                f"{ack_wait / 2:g}, or delete the consumer so the worker recreates it"
            )
        short = [b for b in config.backoff or [] if b < 2 * self.heartbeat]
        if short:
            problems.append(
                f"has redelivery backoff {config.backoff} with steps shorter than twice the "
                f"heartbeat ({self.heartbeat:g} s): a running trigger would be redelivered"
            )
        if problems:
            where = f"consumer {self.durable} on stream {self.stream}"
            raise WorkerSetupError(f"{where} {'; '.join(problems)}")
        wanted = set(self.subjects)
        filtered = set(config.filter_subjects or []) | (
            {config.filter_subject} if config.filter_subject else set()
        )
        if filtered and filtered != wanted:
            log.warning(
                "consumer %s filters %s, not the subjects this worker was given (%s); it "
                "delivers what it filters",
                self.durable,
                sorted(filtered),
                sorted(wanted),
            )
        max_deliver = config.max_deliver if config.max_deliver and config.max_deliver > 0 else -1
        if (ack_wait, max_deliver) != (self.ack_wait, self.max_deliver):
            log.info(
                "consumer %s exists with ack_wait %g s and max_deliver %d; using those",
                self.durable,
                ack_wait,
                max_deliver,
            )
        self.ack_wait = ack_wait
        self.max_deliver = max_deliver
