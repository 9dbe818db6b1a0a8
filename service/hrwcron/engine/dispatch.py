"""The life of a tick, for many ticks at once: claims, then fenced publishes, as batches.

The timer hands over every tick this replica should act on now. A batch is one coroutine: the
claims of all its ticks go out in one pipelined round; each tick then moves on as soon as its
own answer arrives, and the publishes of the ticks whose answers came together go out as the
next round. Each tick's outcome is its own: a lost claim, a fence conflict, a refusal, an
error or no answer in time touches that tick only. The rare steps (reading a claim held by
someone else, taking it over, the overlap check, re-reading a fenced subject) run as their
own small coroutines inside the batch, and so do the rarer still: reading a max_runs job's
run count, and recording on a claim that the server refused its trigger.

The module is longer than the others because a tick's steps are one state machine, read best
top to bottom in one place; the flight, the batch and the trigger messages live in flight.py.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Awaitable, Sequence
from typing import Any, Protocol

from hrwcron.core.errors import HrwcronError
from hrwcron.core.model import ClaimRecord
from hrwcron.core.outcomes import CLAIM_RESOLVED, Outcome
from hrwcron.core.ticks import TickId
from hrwcron.engine.clock import Clock
from hrwcron.engine.failpoints import Failpoints
from hrwcron.engine.flight import (
    Batch,
    Flight,
    Step,
    T,
    Then,
    cloudevents_headers,
    trigger_writes,
)
from hrwcron.engine.jobs import HeldClaim, Job
from hrwcron.engine.ledger import TriggerLedger
from hrwcron.engine.ports import (
    ClaimsPort,
    FenceConflict,
    LastTrigger,
    Observer,
    Published,
    RunsPort,
    StoreRefused,
    TriggersPort,
)
from hrwcron.engine.run_counter import RunCounter
from hrwcron.engine.settings import Settings

log = logging.getLogger("hrwcron.scheduler")

# How often one tick may find its subject moved on and re-read it before giving up for now.
MAX_FENCES = 5
# At most this many earlier ticks' claims are read before a tick is published after a gap
# (the newest of them), and at most this many ticks are walked to find them.
MAX_EARLIER = 64
MAX_EARLIER_STEPS = 4096
CLOCK_IN_DOUBT = "the clock is off the NATS server's by more than max_clock_skew"


class TickHost(Protocol):
    """What the dispatcher needs from the replica that hands it ticks."""

    @property
    def stopping(self) -> bool: ...
    def claim_ttl(self, job: Job) -> float:
        """How long a claim on one of ``job``'s ticks may live."""

    def holder_live(self, node: str, instance: str) -> bool:
        """Whether a claim's holder is live and ready."""

    @property
    def quiet(self) -> bool:
        """Whether this replica does not follow the trigger stream (it reads progress marks)."""

    @property
    def clock_off(self) -> bool:
        """Whether this replica's clock and the server's disagree by more than
        max_clock_skew, so that neither can say whether a tick is late."""

    def mark_bad(self, job: Job, problem: str) -> None:
        """The job's ticks fail for what the job is."""

    def log_error(self, job: Job, tick_key: str, error: str) -> None:
        """A tick failed with ``error``; it will be retried."""

    def acted(self, flight: Flight) -> None:
        """A scheduled tick's act ended with ``flight.outcome``."""


class Dispatcher:
    """Runs batches of flights for one replica; at most ``max_in_flight`` ticks at a time."""

    def __init__(
        self,
        host: TickHost,
        settings: Settings,
        *,
        claims: ClaimsPort,
        triggers: TriggersPort,
        runs: RunsPort | None,
        ledger: TriggerLedger,
        counter: RunCounter,
        observer: Observer,
        clock: Clock,
        failpoints: Failpoints,
        instance: str,
    ) -> None:
        self._s = host
        self._settings = settings
        self.node = settings.node_id
        self._cloudevents = cloudevents_headers(settings.cloudevents_source)
        self.instance = instance
        self.claims = claims
        self._triggers = triggers
        self._runs = runs
        self._ledger = ledger
        self._last = ledger.last
        self._counter = counter
        self._observer = observer
        self._tracing = observer.tracing
        self._clock = clock
        self._failpoints = failpoints
        # Ticks beyond max_in_flight wait here for a batch to start them.
        self.queued: collections.deque[Flight] = collections.deque()
        self.in_flight = 0
        self.tasks: set[asyncio.Task[None]] = set()
        # Claim operations so far, reported to the observer per batch: what a tick costs the
        # claims bucket beyond its one create.
        self.creates = 0
        self.reads = 0
        self.replaces = 0
        self._told = (0, 0, 0)  # the counts last reported to the observer

    # ------------------------------------------------------------------------- batches

    def submit(self, flights: Sequence[Flight]) -> None:
        self.queued.extend(flights)
        self.start_batches()

    def start_batches(self) -> None:
        s = self._s
        queued = self.queued
        room = self._settings.max_in_flight - self.in_flight
        if room <= 0 or not queued or s.stopping:
            return
        take = [queued.popleft() for _ in range(min(room, len(queued)))]
        self.in_flight += len(take)
        task = asyncio.create_task(self.run(take), name="ticks")
        self.tasks.add(task)
        task.add_done_callback(self._batch_done)

    def _batch_done(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("a batch of ticks crashed: %r", task.exception())

    async def run(self, flights: list[Flight]) -> None:
        """Claims, then publishes, for every flight; returns once each has an outcome (or the
        batch's deadline passed: what is still unanswered then counts as an error)."""
        # A little beyond the stores' own deadline, which answers first when they have one.
        batch = Batch(self._settings.write_timeout + 1.0)
        creates: list[Flight] = []
        for flight in flights:
            self._begin(flight, batch, creates)
        try:
            await self._send_creates(creates, batch)
            while batch.pending:
                if not batch.answered:
                    batch.event.clear()
                    try:
                        async with asyncio.timeout_at(batch.deadline):
                            await batch.event.wait()
                    except TimeoutError:
                        break
                answered, batch.answered = batch.answered, []
                publishes: list[Flight] = []
                for future in answered:
                    flight, step, then = batch.pending.pop(future)
                    self._advance(flight, step, then, future, batch, publishes)
                won, batch.won = batch.won, []
                if won and self._failpoints:
                    for flight in won:
                        if flight.kind == "scheduled":
                            await self._failpoints.hit("after_claim", flight.job.spec.name)
                for flight in won:
                    self._pre_publish(flight, batch, publishes)
                await self._send_publishes(publishes, batch)
                self.start_batches()
            for future, (flight, _, _) in list(batch.pending.items()):
                future.cancel()
                self._fail(flight, "no answer before the batch's deadline")
            batch.pending.clear()
        finally:
            # Cancelled (stopping): whatever is left ends as an error, and no later answer
            # can touch it.
            for future, (flight, _, _) in batch.pending.items():
                future.cancel()
                if not flight.outcome:
                    self._fail(flight, "stopped")
            self._report_ops()
            self.start_batches()

    def _report_ops(self) -> None:
        told = self._told
        ops = (self.creates - told[0], self.reads - told[1], self.replaces - told[2])
        if any(ops):
            self._told = (self.creates, self.reads, self.replaces)
            self._observer.claim_ops(*ops)

    # --------------------------------------------------------------------------- steps

    def _begin(self, flight: Flight, batch: Batch, creates: list[Flight]) -> None:
        job = flight.job
        if self._tracing:
            flight.span = self._observer.start_tick_span(
                job.spec.name, flight.msg_id, flight.due, flight.rank
            )
            if flight.kind != "scheduled":
                flight.span.set("hrwcron.kind", flight.kind)
        if flight.kind == "scheduled":
            if self._ledger.done(job.subject, flight.due):
                self._resolve(flight, Outcome.ALREADY_CLAIMED if job.acted else Outcome.NOT_OWNER)
                return
            job.acted = True
            held, key = job.claim_seen, flight.claim_key
            if held is not None:
                # Seen held by someone else before: what matters now is that claim's state.
                self._spawn(batch, flight, Step.READ, self.claims.get(key), self._read)
                self.reads += 1
                return
        flight.record = ClaimRecord(
            node=self.node, instance=self.instance, attempt=1, claimed_ms=int(self._clock.now_ms())
        )
        creates.append(flight)

    async def _send_creates(self, flights: list[Flight], batch: Batch) -> None:
        if not flights:
            return
        s = self._s
        writes = []
        for flight in flights:
            assert flight.record is not None
            writes.append((flight.claim_key, flight.record, s.claim_ttl(flight.job)))
            if flight.span is not None:
                flight.step_span = flight.span.start_child(
                    "hrwcron.claim", {"hrwcron.claim.key": flight.claim_key}
                )
        self.creates += len(flights)
        await self._send(
            flights, batch, Step.CREATE, self.claims.create_many(writes), self._created
        )

    def _advance(
        self,
        flight: Flight,
        step: Step,
        then: Then[Any] | None,
        future: asyncio.Future[Any],
        batch: Batch,
        publishes: list[Flight],
    ) -> None:
        if future.cancelled():
            self._fail(flight, "cancelled")
            return
        error = future.exception()
        match step:
            case Step.PUBLISH:
                self._published(flight, future, error, batch, publishes)
                return
            case Step.REJECT:
                # Recorded on the claim or not, the trigger cannot be published: a replica
                # that does not see the record tries once more and meets the same refusal.
                self._resolve(flight, Outcome.REJECTED)
                return
        step_span = flight.step_span
        if step_span is not None:
            if step == Step.CREATE:
                step_span.set("hrwcron.claim.won", error is None and future.result() is not None)
            self._end_step(flight)
        if error is not None:
            self._fail(flight, f"{type(error).__name__}: {error}")
            return
        assert then is not None  # only a publish and a rejection are answered above
        then(flight, future.result(), batch, publishes)

    # Each continuation takes its step's answer, typed as the store gives it.

    def _created(
        self, flight: Flight, revision: int | None, batch: Batch, publishes: list[Flight]
    ) -> None:
        if revision is not None:
            flight.revision = revision
            flight.attempt = 1
            batch.won.append(flight)
        elif flight.kind != "scheduled":
            self._resolve(flight, Outcome.DUPLICATE)  # this Msg-Id was claimed before
        else:
            self._spawn(batch, flight, Step.READ, self.claims.get(flight.claim_key), self._read)
            self.reads += 1

    def _skip_recorded(
        self, flight: Flight, _revision: int | None, batch: Batch, publishes: list[Flight]
    ) -> None:
        self._resolve(flight, Outcome.SKIPPED)

    def _last_read(
        self, flight: Flight, last: LastTrigger | None, batch: Batch, publishes: list[Flight]
    ) -> None:
        if last is not None:
            self._ledger.remember(flight.job.subject, last)
        self._prepare(flight, batch, publishes)

    def _count_loaded(
        self, flight: Flight, _loaded: None, batch: Batch, publishes: list[Flight]
    ) -> None:
        self._prepare(flight, batch, publishes)

    def _held_checked(
        self, flight: Flight, last: LastTrigger | None, batch: Batch, publishes: list[Flight]
    ) -> None:
        if last is not None:
            self._ledger.remember(flight.job.subject, last)
        # Published by the live holder: done. Not yet: wait for it, as before.
        done = last is not None and last.watermark >= flight.due
        self._resolve(flight, Outcome.ALREADY_CLAIMED if done else Outcome.LOCK_BUSY)

    def _read(
        self,
        flight: Flight,
        held: tuple[ClaimRecord, int] | None,
        batch: Batch,
        publishes: list[Flight],
    ) -> None:
        """Someone holds this tick's claim. Ours from before (same instance): go on. Held by an
        instance that is not live and ready, or unchanged beyond the lease: take it over.
        Otherwise wait for the trigger to show up in the feed, or for the holder to fall
        silent, without reading the claim again meanwhile."""
        s = self._s
        job = flight.job
        if held is None:
            job.claim_seen = None
            self._resolve(flight, Outcome.LOCK_BUSY)  # expired between our create and read
            return
        record, revision = held
        flight.attempt = record.attempt
        if record.outcome in CLAIM_RESOLVED:
            self._resolve(flight, Outcome.ALREADY_CLAIMED)
            return
        if record.instance == self.instance:
            flight.record, flight.revision = record, revision
            self._pre_publish(flight, batch, publishes)
            return
        now = self._clock.monotonic()
        seen = job.claim_seen
        if seen is None or seen.revision != revision:
            seen = HeldClaim(revision, now, record.node, record.instance)
            job.claim_seen = seen
        reason = ""
        if not s.holder_live(record.node, record.instance):
            reason = "its holder is not live and ready"
        elif now - seen.seen_mono >= self._settings.claim_lease:
            reason = f"unchanged for {now - seen.seen_mono:.1f} s"
        if not reason:
            if self._s.quiet:
                # Nothing follows the stream here: ask it whether the holder published.
                last = self._triggers.last(job.subject)
                self._spawn(batch, flight, Step.HELD, last, self._held_checked)
                return
            self._resolve(flight, Outcome.LOCK_BUSY)
            return
        takeover = ClaimRecord(
            node=self.node,
            instance=self.instance,
            attempt=record.attempt + 1,
            claimed_ms=int(self._clock.now_ms()),
        )
        flight.record = takeover
        flight.attempt = takeover.attempt
        if flight.span is not None:
            flight.span.set("hrwcron.takeover", True)
        log.info("tick %s: took over the claim of %s (%s)", flight.msg_id, record.node, reason)
        write = self.claims.replace(flight.claim_key, takeover, revision, s.claim_ttl(job))
        self._spawn(batch, flight, Step.TAKEOVER, write, self._taken_over)
        self.replaces += 1

    def _taken_over(
        self, flight: Flight, revision: int | None, batch: Batch, publishes: list[Flight]
    ) -> None:
        if revision is None:
            flight.job.claim_seen = None
            self._resolve(flight, Outcome.LOCK_BUSY)  # another replica took it over first
            return
        flight.revision = revision
        self._prepare(flight, batch, publishes)  # a takeover never skips: the holder decided

    def _pre_publish(self, flight: Flight, batch: Batch, publishes: list[Flight]) -> None:
        runs = self._runs
        job = flight.job
        if (
            runs is not None
            and flight.kind == "scheduled"
            and job.spec.overlap == "skip"
            and flight.attempt == 1
        ):
            self._spawn(batch, flight, Step.RUNS, runs.running(job.spec.name), self._runs_checked)
            return
        self._prepare(flight, batch, publishes)

    def _runs_checked(
        self, flight: Flight, running: bool, batch: Batch, publishes: list[Flight]
    ) -> None:
        if not running:
            self._prepare(flight, batch, publishes)
            return
        self._resolve_claim(flight, batch, Step.SKIP, Outcome.SKIPPED, self._skip_recorded)

    def _resolve_claim(
        self,
        flight: Flight,
        batch: Batch,
        step: Step,
        outcome: Outcome,
        then: Then[int | None] | None,
    ) -> None:
        """Record on the claim that the tick is resolved without a trigger, so the others
        take it as done instead of taking the claim over; ``then`` once it is recorded (None:
        the step is answered in ``_advance``, whatever became of the write)."""
        s = self._s
        claim = flight.record
        assert claim is not None
        resolved = ClaimRecord(
            node=claim.node,
            instance=claim.instance,
            attempt=claim.attempt,
            claimed_ms=claim.claimed_ms,
            outcome=outcome,
        )
        write = self.claims.replace(
            flight.claim_key, resolved, flight.revision, s.claim_ttl(flight.job)
        )
        self._spawn(batch, flight, step, write, then)
        self.replaces += 1

    def _prepare(self, flight: Flight, batch: Batch, publishes: list[Flight]) -> None:
        """Checks right before publishing, as of now: a replica that woke up late must not
        publish late, a subject that already holds this tick or a later one is done, and a
        max_runs job numbers its trigger from the subject's newest one (see core/run_limits.py)."""
        job = flight.job
        due = flight.due
        scheduled = flight.kind == "scheduled"
        # Judged by the latest the server's clock can be: a replica whose time source answers
        # slowly runs behind it (never ahead), and must not publish past the window for that.
        if scheduled and self._clock.latest_ms() > due + job.spec.max_lateness_ms:
            if self._s.clock_off:
                # A server clock stepped ahead while the tick was claimed makes it look late:
                # not published, not missed, but decided again once the clock is trusted.
                self._fail(flight, f"{CLOCK_IN_DOUBT}: not published, decided again later")
                return
            self._resolve(flight, Outcome.MISSED)
            return
        last = self._last.get(job.subject)
        if scheduled and last is not None and last.watermark >= due:
            self._resolve(
                flight, Outcome.DUPLICATE if last.msg_id == flight.msg_id else Outcome.FENCED
            )
            return
        if scheduled and flight.looked_back < 2:
            earlier = self._unseen_before(job, last, due)
            if earlier:
                flight.looked_back += 1
                if flight.looked_back == 1:
                    # Most such gaps are ticks others published while this replica did not
                    # follow the subject (a follower taking over): one read closes them.
                    last_read = self._triggers.last(job.subject)
                    self._spawn(batch, flight, Step.LAST, last_read, self._last_read)
                    return
                reads = self._claims_of(job, earlier)
                self._spawn(batch, flight, Step.EARLIER, reads, self._earlier_checked)
                self.reads += len(earlier)
                return
        max_runs = job.spec.max_runs
        if max_runs is not None:
            counter = self._counter
            name = job.spec.name
            if not counter.known(name):
                self._spawn(batch, flight, Step.COUNT, counter.load(name), self._count_loaded)
                return
            flight.run = counter.run_number(name, last.run if last else 0, max_runs, scheduled)
            if flight.run is None:
                self._resolve(flight, Outcome.MAX_RUNS)  # the limit was reached before this tick
                return
        flight.watermark = due if scheduled else (last.watermark if last else 0)
        flight.expected = last.seq if last else 0
        publishes.append(flight)

    def _unseen_before(self, job: Job, last: LastTrigger | None, due: int) -> list[int]:
        """The job's ticks before ``due`` that this replica has not seen in the stream and
        that someone may still publish (their lateness window, widened by max_clock_skew, is
        open). Publishing ``due`` first would fence such a tick out for good if another
        replica holds its claim and is still trying to publish it, so the subject is read
        again and then, if some are still not in, their claims. One schedule step when the
        newest trigger seen is the tick just before."""
        plan = job.plan
        seen = last.watermark if last is not None else 0
        skew_ms = self._settings.max_clock_skew_ms
        cutoff = int(self._clock.now_ms() - job.spec.max_lateness_ms - skew_ms)
        found: collections.deque[int] = collections.deque(maxlen=MAX_EARLIER)
        try:
            tick = plan.next_after(max(seen, cutoff - 1))
            for _ in range(MAX_EARLIER_STEPS):
                if tick is None or tick >= due:
                    break
                if not plan.excluded(tick):
                    found.append(tick)
                tick = plan.next_after(tick)
        except HrwcronError:
            pass  # the schedule ran out of supported years: nothing before ``due`` to find
        return list(found)

    async def _claims_of(self, job: Job, dues: list[int]) -> list[tuple[int, ClaimRecord]]:
        """The claims held on ``job``'s ticks at ``dues``, read together."""
        name = job.spec.name
        answers = await asyncio.gather(
            *(self.claims.get(TickId(name, due).claim_key) for due in dues)
        )
        return [(due, held[0]) for due, held in zip(dues, answers, strict=True) if held]

    def _earlier_checked(
        self,
        flight: Flight,
        held: list[tuple[int, ClaimRecord]],
        batch: Batch,
        publishes: list[Flight],
    ) -> None:
        claimed = [
            due
            for due, record in held
            if record.outcome not in CLAIM_RESOLVED and record.instance != self.instance
        ]
        if not claimed:
            self._prepare(flight, batch, publishes)
            return
        # Another replica set out to publish an earlier tick, and the stream did not have it
        # when last read here: see whether it has by now.
        flight.earlier = tuple(claimed)
        last = self._triggers.last(flight.job.subject)
        self._spawn(batch, flight, Step.AWAIT, last, self._earlier_awaited)

    def _earlier_awaited(
        self, flight: Flight, last: LastTrigger | None, batch: Batch, publishes: list[Flight]
    ) -> None:
        job = flight.job
        if last is not None:
            self._ledger.remember(job.subject, last)
            flight.earlier = tuple(due for due in flight.earlier if due > last.watermark)
        if flight.earlier:
            # Still not in: the job acts on the earliest of them first (waits for its holder,
            # or takes it over as any claim), so this tick cannot fence it out.
            self._resolve(flight, Outcome.LOCK_BUSY)
            return
        self._prepare(flight, batch, publishes)

    async def _send_publishes(self, flights: list[Flight], batch: Batch) -> None:
        if not flights:
            return
        writes = trigger_writes(flights, self.node, self._clock.now_ms(), self._cloudevents)
        await self._send(flights, batch, Step.PUBLISH, self._triggers.publish_many(writes), None)

    async def _send(
        self,
        flights: list[Flight],
        batch: Batch,
        step: Step,
        writes: Awaitable[Sequence[asyncio.Future[T]]],
        then: Then[T] | None,
    ) -> None:
        """Send one round of writes; each flight then waits for its own answer."""
        batch.sent()
        try:
            futures = await writes
        except Exception as exc:
            for flight in flights:
                self._fail(flight, f"{type(exc).__name__}: {exc}")
            return
        for flight, future in zip(flights, futures, strict=True):
            batch.wait(flight, future, step, then)

    def _published(
        self,
        flight: Flight,
        future: asyncio.Future[Published],
        error: BaseException | None,
        batch: Batch,
        publishes: list[Flight],
    ) -> None:
        s = self._s
        subject = flight.job.subject
        if isinstance(error, FenceConflict):
            if flight.step_span is not None:
                flight.step_span.set("hrwcron.fenced", True)
            self._end_step(flight)
            # The subject moved on: re-read its last message; if that is this tick, it is done.
            flight.fences += 1
            if flight.fences >= MAX_FENCES:
                self._resolve(flight, Outcome.LOCK_BUSY)
                return
            self._ledger.forget(subject)
            self._spawn(batch, flight, Step.LAST, self._triggers.last(subject), self._last_read)
            return
        if isinstance(error, StoreRefused):
            if flight.step_span is not None:
                flight.step_span.set("hrwcron.rejected", str(error))
            self._end_step(flight)
            # Sending it again cannot succeed: this tick fails, not the replica.
            s.mark_bad(flight.job, f"the server refused its trigger: {error}")
            if flight.kind == "scheduled":
                self._resolve_claim(flight, batch, Step.REJECT, Outcome.REJECTED, None)
            else:
                self._resolve(flight, Outcome.REJECTED)  # its caller gives the claim back
            return
        self._end_step(flight)
        if error is not None:
            self._fail(flight, f"{type(error).__name__}: {error}")
            return
        job = flight.job
        job.problem = job.logged = ""
        ack = future.result()
        if ack.duplicate:
            self._resolve(flight, Outcome.DUPLICATE)
            return
        seen = LastTrigger(ack.seq, flight.msg_id, flight.watermark, flight.run or 0)
        self._ledger.remember(subject, seen)
        self._resolve(flight, Outcome.STARTED)

    # ------------------------------------------------------------------------ outcomes

    def _spawn(
        self,
        batch: Batch,
        flight: Flight,
        step: Step,
        work: Awaitable[T],
        then: Then[T] | None,
    ) -> None:
        batch.sent()
        batch.wait(flight, asyncio.ensure_future(work), step, then)

    @staticmethod
    def _end_step(flight: Flight) -> None:
        if flight.step_span is not None:
            flight.step_span.end()
            flight.step_span = None

    def _fail(self, flight: Flight, error: str) -> None:
        self._end_step(flight)
        flight.error = error
        self._s.log_error(flight.job, flight.msg_id, error)
        if flight.span is not None:
            flight.span.set("error", error)
        self._resolve(flight, Outcome.ERROR)

    def _resolve(self, flight: Flight, outcome: Outcome) -> None:
        if flight.outcome:
            return
        flight.outcome = outcome
        span = flight.span
        if span is not None:
            self._end_step(flight)
            span.set("outcome", outcome)
            span.set("attempt", flight.attempt)
            span.end()
        if flight.kind == "scheduled":
            self.in_flight -= 1
            self._s.acted(flight)
