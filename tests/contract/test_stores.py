"""One contract for the engine's stores, run over the in-memory stores and over JetStream.

The engine's unit tests trust the memory stores to behave like the JetStream adapters on a real
nats-server; every behaviour the engine relies on (create-only claims, compare-and-set, per-key
TTL, Msg-Id deduplication, subject-sequence fencing, watch streams) is pinned here for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import nats
import pytest
from nats.js.api import KeyValueConfig

from harness import NatsServer, live_keys, wait_for_async
from hrwcron.adapters.jetstream.claims import JetStreamClaims
from hrwcron.adapters.jetstream.connect import ConnectionHooks, connect
from hrwcron.adapters.jetstream.counts_bucket import JetStreamCounts
from hrwcron.adapters.jetstream.jobs import JetStreamJobs, has_lanes
from hrwcron.adapters.jetstream.kv import conditional_writes
from hrwcron.adapters.jetstream.members import JetStreamMembers
from hrwcron.adapters.jetstream.pipeline import JetStreamPipeline
from hrwcron.adapters.jetstream.provision import Layout, provision
from hrwcron.adapters.jetstream.triggers import JetStreamTriggers
from hrwcron.adapters.memory import (
    MemoryClaims,
    MemoryCounts,
    MemoryJobs,
    MemoryMembers,
    MemoryTriggers,
)
from hrwcron.core import partitions
from hrwcron.core.config import NatsConfig
from hrwcron.core.errors import ConflictError, DuplicateNodeError, SubjectTakenError
from hrwcron.core.model import ClaimRecord, Heartbeat, JobSpec, encode
from hrwcron.engine.ports import (
    HEADER_MSG_ID,
    HEADER_RUN,
    HEADER_WATERMARK,
    ClaimsPort,
    CountsPort,
    Covered,
    FenceConflict,
    JobEvent,
    JobsPort,
    LastTrigger,
    MemberRecord,
    MembersPort,
    Published,
    StoreRefused,
    StoreUnavailable,
    TriggersPort,
)

T = TypeVar("T")

MEMBER_TTL = 1.0
DUPLICATE_WINDOW = 2.0
# Generous for a loaded machine: an answer the contract expects "at once" arrives well within.
STEP = 10.0
# How long a batched write waits for its answer before it counts as unavailable.
WRITE_TIMEOUT = 1.0


@dataclass
class Backend:
    name: str
    members: MembersPort
    claims: ClaimsPort
    triggers: TriggersPort
    jobs: JobsPort
    prefix: str
    # Makes publishes to a subject go unanswered (a hang), returns that subject.
    silence: Callable[[], Awaitable[str]]
    counts: CountsPort


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    """One server for the module; each test gets its own buckets and stream on it."""
    server = NatsServer(name="contract", base_dir=Path(tmp_path_factory.mktemp("nats"))).start()
    try:
        yield server
    finally:
        server.cleanup()


_names = itertools.count()


@pytest.fixture(params=["memory", "jetstream"])
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    if request.param == "memory":
        triggers = MemoryTriggers(duplicate_window=DUPLICATE_WINDOW, timeout=WRITE_TIMEOUT)

        async def silence_memory() -> str:
            triggers.silenced.add("ct.trigger.silent")
            return "ct.trigger.silent"

        yield Backend(
            "memory",
            MemoryMembers(MEMBER_TTL),
            MemoryClaims(),
            triggers,
            MemoryJobs("ct.trigger"),
            "ct.trigger",
            silence_memory,
            MemoryCounts(),
        )
        return
    server: NatsServer = request.getfixturevalue("shared_server")
    n = next(_names)
    layout = Layout(
        members_bucket=f"ct{n}_members",
        claims_bucket=f"ct{n}_claims",
        jobs_bucket=f"ct{n}_jobs",
        runs_bucket=f"ct{n}_runs",
        counts_bucket=f"ct{n}_counts",
        stream=f"CT{n}_TRIGGERS",
        subject_prefix=f"ct{n}.trigger",
        member_ttl=MEMBER_TTL,
        duplicate_window=DUPLICATE_WINDOW,
    )
    client = await nats.connect(server.url, connect_timeout=5)
    pipeline = JetStreamPipeline(client, timeout=WRITE_TIMEOUT)

    async def silence_jetstream() -> str:
        # A subject outside every stream with a listener that never answers: without the
        # listener the server would answer "no responders" at once.
        subject = f"ct{n}.silent"
        await client.subscribe(subject)
        await client.flush()
        return subject

    try:
        js = client.jetstream()
        await provision(js, layout, longest_lateness=DUPLICATE_WINDOW)
        claims_kv = await js.key_value(layout.claims_bucket)
        yield Backend(
            "jetstream",
            JetStreamMembers(js, await js.key_value(layout.members_bucket), layout.members_bucket),
            JetStreamClaims(js, claims_kv, layout.claims_bucket, pipeline),
            JetStreamTriggers(js, layout.stream, layout.subject_prefix, pipeline),
            JetStreamJobs(
                js,
                await js.key_value(layout.jobs_bucket),
                layout.jobs_bucket,
                claims_bucket=layout.claims_bucket,
                subject_prefix=layout.subject_prefix,
                pipeline=pipeline,
                covered_every=0.2,
            ),
            layout.subject_prefix,
            silence_jetstream,
            JetStreamCounts(js, await js.key_value(layout.counts_bucket), layout.counts_bucket),
        )
    finally:
        await client.close()


class Stream:
    """Pulls items from an async iterator one at a time, each with a deadline."""

    def __init__(self, source: AsyncIterator[T]) -> None:
        self._source = source

    async def next(self, timeout: float = STEP) -> Any:
        return await asyncio.wait_for(anext(self._source), timeout)

    async def until(self, marker: Any, timeout: float = STEP) -> list[Any]:
        """Items up to (not including) ``marker``."""
        found = []
        while (item := await self.next(timeout)) != marker:
            found.append(item)
        return found

    async def close(self) -> None:
        closer = getattr(self._source, "aclose", None)
        if closer is not None:
            await closer()


async def changes_only(
    watch: AsyncIterator[JobEvent | Covered | None],
) -> AsyncIterator[JobEvent | None]:
    async for item in watch:
        if not isinstance(item, Covered):
            yield item


def heartbeat(node: str, instance: str = "i1", digest: str = "") -> Heartbeat:
    return Heartbeat(
        node=node, instance=instance, started_ms=1, version="test", digest=digest, jobs=0
    )


def claim(node: str, attempt: int = 1) -> ClaimRecord:
    return ClaimRecord(node=node, instance=f"{node}-i", attempt=attempt, claimed_ms=1)


def headers(msg_id: str, watermark: int) -> dict[str, str]:
    return {HEADER_MSG_ID: msg_id, HEADER_WATERMARK: str(watermark)}


# --- claims --------------------------------------------------------------------------------


async def test_claim_is_create_only(backend: Backend) -> None:
    first = await backend.claims.create("job.1000", claim("a"), ttl=60)
    assert first is not None and first > 0
    assert await backend.claims.create("job.1000", claim("b"), ttl=60) is None
    held = await backend.claims.get("job.1000")
    assert held is not None
    record, revision = held
    assert (record.node, revision) == ("a", first)
    assert await backend.claims.get("job.2000") is None


async def test_claim_replace_is_compare_and_set(backend: Backend) -> None:
    first = await backend.claims.create("job.1000", claim("a"), ttl=60)
    assert first is not None
    second = await backend.claims.replace("job.1000", claim("b", 2), first, ttl=60)
    assert second is not None and second > first
    # A takeover racing on the revision it read loses: only one of two replicas wins.
    assert await backend.claims.replace("job.1000", claim("c", 2), first, ttl=60) is None
    held = await backend.claims.get("job.1000")
    assert held is not None and (held[0].node, held[0].attempt, held[1]) == ("b", 2, second)
    assert await backend.claims.replace("job.9999", claim("c"), first, ttl=60) is None
    assert await backend.claims.get("job.9999") is None


async def test_claim_expires_after_its_ttl(backend: Backend) -> None:
    assert await backend.claims.create("job.1000", claim("a"), ttl=1) is not None
    assert await backend.claims.create("job.2000", claim("a"), ttl=60) is not None
    await wait_for_async(
        lambda: _absent(backend.claims.get("job.1000")), timeout=STEP, message="claim expiry"
    )
    # Expired means free again: the next create wins, and the long-lived claim is untouched.
    assert await backend.claims.create("job.1000", claim("b"), ttl=60) is not None
    held = await backend.claims.get("job.1000")
    assert held is not None and held[0].node == "b"
    assert await backend.claims.get("job.2000") is not None


async def test_claim_replace_renews_the_ttl(backend: Backend) -> None:
    first = await backend.claims.create("job.1000", claim("a"), ttl=1)
    assert first is not None
    assert await backend.claims.replace("job.1000", claim("b", 2), first, ttl=60) is not None
    # Still there after the first TTL has long passed (checked against a fresh 1 s claim).
    assert await backend.claims.create("job.probe", claim("a"), ttl=1) is not None
    await wait_for_async(
        lambda: _absent(backend.claims.get("job.probe")), timeout=STEP, message="probe expiry"
    )
    held = await backend.claims.get("job.1000")
    assert held is not None and held[0].node == "b"


async def test_claims_created_in_one_batch_are_answered_one_by_one(backend: Backend) -> None:
    held = await backend.claims.create("job.1000", claim("a"), ttl=60)
    assert held is not None
    answers = await backend.claims.create_many(
        [
            ("job.1000", claim("b"), 60),  # held already: lost
            ("job.2000", claim("b"), 60),  # free: won
            ("job.3000", claim("b"), 60),  # won by the first of two writes in one batch
            ("job.3000", claim("c"), 60),
        ]
    )
    lost, won, first, second = [await asyncio.wait_for(a, STEP) for a in answers]
    assert lost is None and second is None
    assert won is not None and first is not None and held < won < first
    stored = [await backend.claims.get(k) for k in ("job.1000", "job.2000", "job.3000")]
    assert [(s[0].node, s[1]) for s in stored if s] == [("a", held), ("b", won), ("b", first)]
    assert await backend.claims.create_many([]) == []


async def test_a_released_claim_can_be_created_again(backend: Backend) -> None:
    """A trigger that was not published gives its claim back; the retry must be able to
    take it, by a single create or in a batch."""
    first = await backend.claims.create("job.manual.x", claim("a"), ttl=60)
    assert first is not None
    assert not await backend.claims.release("job.manual.x", first + 1)  # not the revision held
    assert await backend.claims.get("job.manual.x") is not None
    assert await backend.claims.release("job.manual.x", first)
    assert await backend.claims.get("job.manual.x") is None
    again = await backend.claims.create("job.manual.x", claim("b"), ttl=60)
    assert again is not None and again > first
    held = await backend.claims.get("job.manual.x")
    assert held is not None and (held[0].node, held[1]) == ("b", again)
    assert await backend.claims.create("job.manual.x", claim("c"), ttl=60) is None
    assert await backend.claims.release("job.manual.x", again)
    (batched,) = await backend.claims.create_many([("job.manual.x", claim("d"), 60)])
    assert await asyncio.wait_for(batched, STEP) is not None


async def _absent(pending: Any) -> bool:
    return await pending is None


# --- triggers ------------------------------------------------------------------------------


async def test_publish_deduplicates_by_msg_id(backend: Backend) -> None:
    subject = f"{backend.prefix}.job"
    first = await backend.triggers.publish(subject, b"{}", headers("job:1000", 1000), 0)
    assert not first.duplicate and first.seq > 0
    again = await backend.triggers.publish(subject, b"{}", headers("job:1000", 1000), first.seq)
    assert again.duplicate and again.seq == first.seq
    last = await backend.triggers.last(subject)
    assert last == LastTrigger(first.seq, "job:1000", 1000)


async def test_a_retry_with_a_stale_expectation_is_fenced(backend: Backend) -> None:
    """A retry after an ambiguous timeout carries the expectation of before its first attempt.
    nats-server checks the expected sequence before the Msg-Id, so the retry is fenced, not
    reported as a duplicate: the publisher must re-read the subject's last message, which
    then names this very tick."""
    subject = f"{backend.prefix}.job"
    first = await backend.triggers.publish(subject, b"{}", headers("job:1000", 1000), 0)
    with pytest.raises(FenceConflict):
        await backend.triggers.publish(subject, b"{}", headers("job:1000", 1000), 0)
    assert await backend.triggers.last(subject) == LastTrigger(first.seq, "job:1000", 1000)


async def test_publish_is_fenced_by_the_subject_sequence(backend: Backend) -> None:
    subject = f"{backend.prefix}.job"
    other = f"{backend.prefix}.other"
    first = await backend.triggers.publish(subject, b"{}", headers("job:1000", 1000), 0)
    with pytest.raises(FenceConflict):
        await backend.triggers.publish(subject, b"{}", headers("job:2000", 2000), 0)
    with pytest.raises(FenceConflict):
        await backend.triggers.publish(subject, b"{}", headers("job:2000", 2000), first.seq + 7)
    # Fencing is per subject: another job's first trigger expects 0 whatever the stream holds.
    side = await backend.triggers.publish(other, b"{}", headers("other:1000", 1000), 0)
    second = await backend.triggers.publish(subject, b"{}", headers("job:2000", 2000), first.seq)
    assert side.seq > first.seq and second.seq > side.seq and not second.duplicate
    assert await backend.triggers.last(subject) == LastTrigger(second.seq, "job:2000", 2000)
    assert await backend.triggers.last(other) == LastTrigger(side.seq, "other:1000", 1000)
    assert await backend.triggers.last(f"{backend.prefix}.nothing") is None


async def test_a_batch_of_triggers_resolves_each_publish_on_its_own(backend: Backend) -> None:
    """Fresh, duplicate and fenced publishes and one that gets no answer, in one batch: each
    gets its own outcome, and the unanswered one holds up none of the others."""
    a, b, c = (f"{backend.prefix}.{name}" for name in "abc")
    a1 = await backend.triggers.publish(a, b"{}", headers("a:1000", 1000), 0)
    silent = await backend.silence()
    answers = await backend.triggers.publish_many(
        [
            (silent, b"{}", headers("silent:1000", 1000), 0),
            (b, b"{}", headers("b:1000", 1000), 0),  # fresh
            (a, b"{}", headers("a:1000", 1000), a1.seq),  # same Msg-Id: a duplicate
            (c, b"{}", headers("c:1000", 1000), 5),  # wrong expectation: fenced
            (b, b"{}", headers("b:2000", 2000), 0),  # fenced by the first b of this batch
        ]
    )
    hung, fresh, dup, fenced, fenced_by_batch = answers
    assert await asyncio.wait_for(dup, STEP) == Published(a1.seq, duplicate=True)
    stored = await asyncio.wait_for(fresh, STEP)
    assert not stored.duplicate and stored.seq > a1.seq
    for future in (fenced, fenced_by_batch):
        with pytest.raises(FenceConflict):
            await asyncio.wait_for(future, STEP)
    assert not hung.done()  # everything else answered while this one still waits
    with pytest.raises(StoreUnavailable):
        await asyncio.wait_for(hung, WRITE_TIMEOUT + STEP)
    assert await backend.triggers.last(b) == LastTrigger(stored.seq, "b:1000", 1000)
    assert await backend.triggers.last(c) is None
    assert await backend.triggers.publish_many([]) == []


@pytest.mark.parametrize("frames", [True, False], ids=["frames", "public-publish"])
async def test_the_pipelined_path_refuses_what_it_cannot_send(
    shared_server: NatsServer, frames: bool
) -> None:
    """JetStream only, both ways the pipeline writes (one frame batch through the client's
    buffer, or nats-py's publish per message): a message too large for the server or with a
    line break in a header is refused on its own, the rest of the batch goes through."""
    client = await nats.connect(shared_server.url, connect_timeout=5)
    try:
        n = next(_names)
        layout = Layout(stream=f"PL{n}", subject_prefix=f"pl{n}.trigger", duplicate_window=60)
        js = client.jetstream()
        await provision(js, layout, longest_lateness=60)
        pipeline = JetStreamPipeline(client, timeout=WRITE_TIMEOUT, frames=frames)
        triggers = JetStreamTriggers(js, layout.stream, layout.subject_prefix, pipeline)
        subject = f"{layout.subject_prefix}.j"
        broken = headers("j:2000", 2000) | {"Hrwcron-Job": "j\r\nNats-Msg-Id: forged"}
        answers = await triggers.publish_many(
            [
                (subject, b"x" * (client.max_payload + 1), headers("j:1000", 1000), 0),
                (f"{layout.subject_prefix}.forged", b"{}", broken, 0),
                (subject, b"{}", headers("j:3000", 3000), 0),
            ]
        )
        too_large, forged, fine = answers
        assert isinstance(too_large.exception(), StoreRefused)
        if frames:  # nats-py's publish strips line breaks from values instead of refusing
            assert isinstance(forged.exception(), StoreRefused)
            assert await triggers.last(f"{layout.subject_prefix}.forged") is None
        stored = await asyncio.wait_for(fine, STEP)
        assert await triggers.last(subject) == LastTrigger(stored.seq, "j:3000", 3000)
    finally:
        await client.close()


async def test_a_server_restart_in_the_middle_of_a_batch(tmp_path: Path) -> None:
    """JetStream only: the server is killed while triggers wait for their answers, some of
    them answered, some sent, some still in the client's buffer. Every write is answered at
    once when the connection drops (stored or unavailable, none left waiting for the
    deadline); a batch sent while disconnected is refused without being buffered; after the
    restart, retrying the unavailable writes with their Msg-Id and expectation leaves each
    trigger in the stream exactly once, whatever the client flushed after reconnecting."""
    server = NatsServer(name="restart", base_dir=tmp_path / "nats").start()
    hooks = ConnectionHooks()
    client = await connect(NatsConfig(servers=[server.url]), hooks=hooks)
    pipeline = JetStreamPipeline(client, timeout=60)  # far longer than the test may wait
    hooks.disconnected.append(pipeline.connection_lost)
    try:
        layout = Layout(stream="RESTART", subject_prefix="rs.trigger", duplicate_window=60)
        js = client.jetstream()
        await provision(js, layout, longest_lateness=60)
        triggers = JetStreamTriggers(js, layout.stream, layout.subject_prefix, pipeline)
        count = 2000

        def batch(tag: str, start: int = 0) -> list[tuple[str, bytes, dict[str, str], int]]:
            return [
                (f"rs.trigger.{tag}{i}", b"{}", headers(f"{tag}{i}:1000", 1000), 0)
                for i in range(start, start + count)
            ]

        writes = batch("j") + batch("j", count)
        answers = await triggers.publish_many(writes[:count])
        await asyncio.wait_for(answers[0], STEP)
        # The second half goes out and the server dies before any of it can be answered.
        answers += await triggers.publish_many(writes[count:])
        server.kill()
        done, _ = await asyncio.wait(answers, timeout=STEP)
        assert len(done) == len(answers), "writes left waiting after the connection dropped"
        ambiguous = [i for i, a in enumerate(answers) if a.exception() is not None]
        assert all(isinstance(answers[i].exception(), StoreUnavailable) for i in ambiguous)
        assert answers[0].exception() is None
        assert set(range(count, 2 * count)) <= set(ambiguous)

        await wait_for_async(lambda: not client.is_connected, timeout=STEP, message="disconnected")
        refused = await triggers.publish_many(batch("gone"))
        assert all(isinstance(a.exception(), StoreUnavailable) for a in refused)

        server.start()
        await wait_for_async(lambda: client.is_connected, timeout=STEP, message="reconnected")
        retried = await triggers.publish_many([writes[i] for i in ambiguous])
        for answer in retried:
            # Fenced: an earlier write had landed, the subject's last is this very trigger.
            with contextlib.suppress(FenceConflict):
                await asyncio.wait_for(answer, STEP)
        # Every subject holds its trigger (stored, or fenced because it was), and only one.
        info = await js.stream_info(layout.stream)
        assert info.state.messages == len(writes)
        for i in [0, count - 1, count, 2 * count - 1]:
            last = await triggers.last(f"rs.trigger.j{i}")
            assert last is not None and last.msg_id == f"j{i}:1000"
        assert await triggers.last("rs.trigger.gone0") is None
    finally:
        await client.close()
        server.cleanup()


async def test_msg_id_dedup_lasts_only_the_duplicate_window(backend: Backend) -> None:
    """Past the duplicate window a replayed Msg-Id is stored again: from then on only the
    expected sequence stands between a zombie's late publish and a second trigger."""
    subject = f"{backend.prefix}.job"
    first = await backend.triggers.publish(subject, b"{}", headers("job:1000", 1000), 0)

    async def stored_again() -> int:
        again = await backend.triggers.publish(subject, b"{}", headers("job:1000", 1000), first.seq)
        return 0 if again.duplicate else again.seq  # a duplicate stores nothing: retry

    replayed = await wait_for_async(
        stored_again, timeout=DUPLICATE_WINDOW * 3 + STEP, message="duplicate window passed"
    )
    assert replayed > first.seq
    with pytest.raises(FenceConflict):
        await backend.triggers.publish(subject, b"{}", headers("job:1000", 1000), first.seq)
    assert await backend.triggers.last(subject) == LastTrigger(replayed, "job:1000", 1000)


async def test_follow_gives_last_per_subject_then_none_then_live(backend: Backend) -> None:
    a, b = f"{backend.prefix}.a", f"{backend.prefix}.b"
    a1 = await backend.triggers.publish(a, b"{}", headers("a:1000", 1000), 0)
    a2 = await backend.triggers.publish(a, b"{}", headers("a:2000", 2000), a1.seq)
    b1 = await backend.triggers.publish(b, b"{}", headers("b:1000", 1000), 0)
    feed = Stream(backend.triggers.follow())
    try:
        snapshot = await feed.until(None)
        assert sorted(snapshot) == [
            (a, LastTrigger(a2.seq, "a:2000", 2000)),
            (b, LastTrigger(b1.seq, "b:1000", 1000)),
        ]
        b2 = await backend.triggers.publish(b, b"{}", headers("b:2000", 2000), b1.seq)
        assert await feed.next() == (b, LastTrigger(b2.seq, "b:2000", 2000))
        # A duplicate stores nothing, so it shows nothing.
        await backend.triggers.publish(b, b"{}", headers("b:2000", 2000), b2.seq)
        a3 = await backend.triggers.publish(a, b"{}", headers("a:3000", 3000), a2.seq)
        assert await feed.next() == (a, LastTrigger(a3.seq, "a:3000", 3000))
    finally:
        await feed.close()


async def test_last_many_reads_the_newest_trigger_of_each_subject_in_one_round(
    backend: Backend,
) -> None:
    a, b, c, never = (f"{backend.prefix}.{n}" for n in ("a", "b", "c", "never"))
    assert await backend.triggers.last_many([a, never]) == {}  # nothing published yet
    a1 = await backend.triggers.publish(a, b"{}", headers("a:1000", 1000), 0)
    a2 = await backend.triggers.publish(a, b"{}", headers("a:2000", 2000), a1.seq)
    b1 = await backend.triggers.publish(b, b"{}", headers("b:1000", 1000), 0)
    await backend.triggers.publish(c, b"{}", headers("c:1000", 1000), 0)  # not asked for
    found = await backend.triggers.last_many([a, b, never, a])
    assert found == {
        a: LastTrigger(a2.seq, "a:2000", 2000),
        b: LastTrigger(b1.seq, "b:1000", 1000),
    }


async def test_last_many_answers_for_more_subjects_than_one_read_takes(
    backend: Backend,
) -> None:
    subjects = [f"{backend.prefix}.many{i:03d}" for i in range(450)]  # over two chunks of 200
    seqs = {}
    for i, subject in enumerate(subjects):
        if i % 3:  # a third never fired
            seqs[subject] = (
                await backend.triggers.publish(subject, b"{}", headers(f"m:{i}", i), 0)
            ).seq
    found = await backend.triggers.last_many(subjects)
    assert {s: t.seq for s, t in found.items()} == seqs


async def test_follow_on_an_empty_stream_is_loaded_at_once(backend: Backend) -> None:
    feed = Stream(backend.triggers.follow())
    try:
        assert await feed.next() is None
        first = await backend.triggers.publish(f"{backend.prefix}.a", b"{}", headers("a:1", 1), 0)
        assert await feed.next() == (f"{backend.prefix}.a", LastTrigger(first.seq, "a:1", 1))
    finally:
        await feed.close()


async def test_the_run_number_travels_with_the_trigger(backend: Backend) -> None:
    subject = f"{backend.prefix}.counted"
    first = await backend.triggers.publish(
        subject, b"{}", {**headers("c:1000", 1000), HEADER_RUN: "7"}, 0
    )
    assert await backend.triggers.last(subject) == LastTrigger(first.seq, "c:1000", 1000, 7)
    feed = Stream(backend.triggers.follow())
    try:
        assert await feed.until(None) == [(subject, LastTrigger(first.seq, "c:1000", 1000, 7))]
        plain = await backend.triggers.publish(subject, b"{}", headers("c:2000", 2000), first.seq)
        # A trigger without the header (a job without max_runs) reads as run 0.
        assert await feed.next() == (subject, LastTrigger(plain.seq, "c:2000", 2000, 0))
    finally:
        await feed.close()


# --- run counts ------------------------------------------------------------------------------


async def test_run_count_only_grows(backend: Backend) -> None:
    counts = backend.counts
    assert await counts.get("job.a") is None
    raised = await counts.raise_total("job.a", 3)
    assert (raised.total, raised.base) == (3, 0)
    lower = await counts.raise_total("job.a", 2)
    assert (lower.total, lower.base) == (3, 0)
    stored = await counts.get("job.a")
    assert stored is not None and (stored.total, stored.base) == (3, 0)
    assert await counts.get("job.b") is None


async def test_concurrent_raises_settle_on_the_largest(backend: Backend) -> None:
    counts = backend.counts
    await asyncio.gather(*(counts.raise_total("job.c", n) for n in (4, 9, 2, 7, 9, 1)))
    stored = await counts.get("job.c")
    assert stored is not None and stored.total == 9


async def test_run_count_reset_starts_again_from_the_largest_total(backend: Backend) -> None:
    counts = backend.counts
    await counts.raise_total("job.d", 5)
    reset = await counts.reset("job.d", 3)
    assert (reset.total, reset.base) == (5, 5)
    again = await counts.reset("job.e", 2)  # never counted in the bucket: the stream's number
    assert (again.total, again.base) == (2, 2)
    raised = await counts.raise_total("job.d", 6)
    assert (raised.total, raised.base) == (6, 5)


# --- members -------------------------------------------------------------------------------


async def test_member_register_beat_and_snapshot(backend: Backend) -> None:
    first = await backend.members.register("n1", heartbeat("n1", digest="d1"), wait=2)
    second = await backend.members.beat("n1", heartbeat("n1", digest="d2"), first)
    assert second > first
    await backend.members.register("n2", heartbeat("n2"), wait=2)
    members = await backend.members.snapshot()
    assert set(members) == {"n1", "n2"}
    assert members["n1"].revision == second and members["n1"].heartbeat.digest == "d2"
    stored = await backend.members.stored_at(second)
    assert stored is not None and abs(stored - time.time() * 1000) < 60_000


async def test_second_replica_with_the_same_node_id_is_refused(backend: Backend) -> None:
    await backend.members.register("n1", heartbeat("n1", "first"), wait=2)
    with pytest.raises(DuplicateNodeError, match="n1"):
        await backend.members.register("n1", heartbeat("n1", "second"), wait=0.5)
    members = await backend.members.snapshot()
    assert members["n1"].heartbeat.instance == "first"


async def test_beat_from_another_instance_conflicts(backend: Backend) -> None:
    mine = await backend.members.register("n1", heartbeat("n1", "first"), wait=2)
    await backend.members.beat("n1", heartbeat("n1", "first"), mine)
    with pytest.raises(ConflictError):
        await backend.members.beat("n1", heartbeat("n1", "intruder"), mine)


async def test_beat_after_a_lost_ack_keeps_going(backend: Backend) -> None:
    """The previous beat landed but its answer was lost: the replica still holds the stale
    revision. Its own key is not a conflict; it learns the current revision."""
    mine = await backend.members.register("n1", heartbeat("n1", "first"), wait=2)
    landed = await backend.members.beat("n1", heartbeat("n1", "first"), mine)
    current = await backend.members.beat("n1", heartbeat("n1", "first"), mine)
    assert current >= landed
    assert await backend.members.beat("n1", heartbeat("n1", "first"), current) > current


async def test_member_expires_and_rejoins(backend: Backend) -> None:
    mine = await backend.members.register("n1", heartbeat("n1"), wait=2)

    async def gone() -> bool:
        return "n1" not in await backend.members.snapshot()

    await wait_for_async(gone, timeout=STEP, message="member expiry")
    # A replica cut off past its TTL comes back with its next beat.
    back = await backend.members.beat("n1", heartbeat("n1"), mine)
    assert back > mine
    assert "n1" in await backend.members.snapshot()
    # Once expired, the node id is free for a new replica too.
    await wait_for_async(gone, timeout=STEP, message="member expiry")
    await backend.members.register("n1", heartbeat("n1", "second"), wait=2)


async def test_member_watch_sees_changes_and_deregistration(backend: Backend) -> None:
    first = await backend.members.register("n1", heartbeat("n1"), wait=2)
    feed = Stream(backend.members.watch())
    try:
        # The current members come first (a watch on a server starts with the bucket's state).
        node, record = await feed.next()
        assert (node, record.revision) == ("n1", first)
        second = await backend.members.register("n2", heartbeat("n2"), wait=2)
        assert await feed.next() == ("n2", MemberRecord(heartbeat("n2"), second))
        await backend.members.deregister("n1")
        assert await feed.next() == ("n1", None)
    finally:
        await feed.close()
    assert set(await backend.members.snapshot()) == {"n2"}


# --- jobs ----------------------------------------------------------------------------------


def spec(name: str, schedule: str = "@every 1s", **kwargs: Any) -> JobSpec:
    return JobSpec(name=name, schedule=schedule, **kwargs)


async def test_job_put_is_compare_and_set(backend: Backend) -> None:
    first = await backend.jobs.put(spec("j"), 0)
    with pytest.raises(ConflictError):
        await backend.jobs.put(spec("j", "@every 2s"), 0)  # create-only
    second = await backend.jobs.put(spec("j", "@every 2s"), first)
    with pytest.raises(ConflictError):
        await backend.jobs.put(spec("j", "@every 3s"), first)  # someone changed it meanwhile
    event = await backend.jobs.get("j")
    assert event is not None and event.spec == spec("j", "@every 2s")
    assert event.revision == second
    third = await backend.jobs.put(spec("j", "@every 4s"), None)  # unconditional
    assert third > second
    assert await backend.jobs.get("missing") is None


async def test_job_delete(backend: Backend) -> None:
    first = await backend.jobs.put(spec("j"), None)
    await backend.jobs.put(spec("k"), None)
    with pytest.raises(ConflictError):
        await backend.jobs.delete("j", first + 100)
    assert await backend.jobs.get("j") is not None
    await backend.jobs.delete("j", first)
    assert await backend.jobs.get("j") is None
    await backend.jobs.delete("k", None)
    assert await backend.jobs.snapshot() == {}


async def test_job_snapshot(backend: Backend) -> None:
    one = await backend.jobs.put(spec("a.one"), None)
    await backend.jobs.put(spec("b"), None)
    await backend.jobs.delete("b", None)
    snapshot = await backend.jobs.snapshot()
    assert set(snapshot) == {"a.one"}
    assert snapshot["a.one"].spec == spec("a.one") and snapshot["a.one"].revision == one


async def test_job_watch_gives_snapshot_then_none_then_changes(backend: Backend) -> None:
    one = await backend.jobs.put(spec("one"), None)
    await backend.jobs.put(spec("gone"), None)
    await backend.jobs.delete("gone", None)
    feed = Stream(changes_only(backend.jobs.watch()))
    try:
        initial = await feed.until(None)
        live = {e.name: e for e in initial if e.spec is not None}
        assert set(live) == {"one"} and live["one"].revision == one
        # Removed jobs may show up as deletions in the initial state, never as jobs.
        assert all(e.spec is None for e in initial if e.name == "gone")
        two = await backend.jobs.put(spec("two", paused=True), 0)
        event: JobEvent = await feed.next()
        assert (event.name, event.spec, event.revision) == ("two", spec("two", paused=True), two)
        assert event.written_ms > 0
        await backend.jobs.delete("one", one)
        event = await feed.next()
        assert (event.name, event.spec) == ("one", None)
        # The bucket's newest revision is the deletion the watch just delivered: what the
        # engine compares to notice a watch that fell silent.
        assert await backend.jobs.last_revision() == event.revision > two
    finally:
        await feed.close()


async def test_job_last_revision_counts_every_write(backend: Backend) -> None:
    before = await backend.jobs.last_revision()
    written = await backend.jobs.put(spec("counted"), None)
    assert before < written == await backend.jobs.last_revision()
    await backend.jobs.delete("counted", None)
    assert await backend.jobs.last_revision() > written


async def test_two_jobs_never_share_a_trigger_subject(backend: Backend) -> None:
    shared = f"{backend.prefix}.shared"
    await backend.jobs.put(spec("first", subject=shared), 0)
    with pytest.raises(SubjectTakenError):
        await backend.jobs.put(spec("second", subject=shared), 0)
    await backend.jobs.put(spec("plain"), 0)
    with pytest.raises(SubjectTakenError):  # nor another job's own subject
        await backend.jobs.put(spec("third", subject=f"{backend.prefix}.plain"), None)
    assert set(await backend.jobs.snapshot()) == {"first", "plain"}
    # Once the holder moves on or is deleted, the subject is free.
    await backend.jobs.put(spec("first", subject=f"{backend.prefix}.elsewhere"), None)
    await backend.jobs.put(spec("second", subject=shared), 0)
    await backend.jobs.delete("second", None)
    await backend.jobs.put(spec("third", subject=shared), 0)


async def test_put_many_answers_each_job_as_put_would(backend: Backend) -> None:
    jobs = backend.jobs
    shared = f"{backend.prefix}.shared"
    kept = await jobs.put(spec("kept"), 0)
    gone = await jobs.put(spec("gone"), 0)
    await jobs.delete("gone", gone)
    await jobs.put(spec("holder", subject=shared), 0)
    answers = await jobs.put_many(
        [
            (spec("new.one"), 0),  # never existed
            (spec("new.two", "@every 2s"), 0),
            (spec("gone", "@every 3s"), 0),  # its key holds a delete marker
            (spec("kept", "@every 4s"), 0),  # exists: create-only refuses
            (spec("taker", subject=shared), 0),  # another job's subject
            (spec("kept", "@every 5s"), kept + 1000),  # stale revision
            (spec("twin.a", subject=f"{backend.prefix}.twin"), 0),
            (spec("twin.b", subject=f"{backend.prefix}.twin"), 0),  # same subject, same batch
        ]
    )
    assert [type(a).__name__ for a in answers] == [
        "int",
        "int",
        "int",
        "ConflictError",
        "SubjectTakenError",
        "ConflictError",
        "int",
        "SubjectTakenError",
    ]
    snapshot = await jobs.snapshot()
    assert set(snapshot) == {"kept", "holder", "new.one", "new.two", "gone", "twin.a"}
    assert snapshot["new.two"].revision == answers[1]
    assert snapshot["gone"].spec == spec("gone", "@every 3s")
    assert snapshot["kept"].spec == spec("kept") and snapshot["kept"].revision == kept
    # The subjects written by the batch are held: nobody else can have them now.
    with pytest.raises(SubjectTakenError):
        await jobs.put(spec("thief", subject=f"{backend.prefix}.new.one"), 0)
    again = await jobs.put_many([(spec("new.one", "@every 9s"), answers[0]), (spec("x"), None)])
    assert all(isinstance(a, int) for a in again)


async def test_bulk_writes_stop_once_a_round_goes_unanswered(shared_server: NatsServer) -> None:
    """JetStream only: compare-and-set writes sent in pipelined rounds. When a round is left
    without answers, the rest is not sent (and says so) rather than piling up more writes
    on a server that stopped answering."""
    client = await nats.connect(shared_server.url, connect_timeout=5)
    try:
        n = next(_names)
        js = client.jetstream()
        bucket = f"bulk{n}"
        await js.create_key_value(bucket=bucket)
        silent = f"bulk{n}.silent"
        await client.subscribe(silent)  # a listener that never answers
        await client.flush()
        pipeline = JetStreamPipeline(client, timeout=WRITE_TIMEOUT)
        key = f"$KV.{bucket}."
        answered = await conditional_writes(
            pipeline, [(key + "a", b"1", 0), (key + "b", b"2", 0)], round_size=1
        )
        assert all(isinstance(a, int) for a in answered)
        stuck = await conditional_writes(
            pipeline,
            [(key + "c", b"3", 0), (silent, b"x", 0), (key + "d", b"4", 0), (key + "a", b"5", 0)],
            round_size=2,
            timeout=WRITE_TIMEOUT,
        )
        assert isinstance(stuck[0], int)
        assert [type(a).__name__ for a in stuck[1:]] == ["StoreUnavailable"] * 3
        assert all("not written" in str(a) for a in stuck[2:])
        assert await live_keys(client, bucket) == ["a", "b", "c"]
    finally:
        await client.close()


async def test_delete_many_answers_each_job(backend: Backend) -> None:
    first = await backend.jobs.put(spec("a"), 0)
    await backend.jobs.put(spec("b"), 0)
    answers = await backend.jobs.delete_many([("a", first + 100), ("b", None)])
    assert isinstance(answers[0], ConflictError) and answers[1] is None
    assert set(await backend.jobs.snapshot()) == {"a"}


def names_in_two_lanes() -> tuple[str, str, str]:
    """Two job names in one lane and a third in another."""
    first = "lane.a0"
    lane = partitions.lane_of(first, ())
    same = next(
        f"lane.b{i}" for i in range(100_000) if partitions.lane_of(f"lane.b{i}", ()) == lane
    )
    other = next(f"lane.c{i}" for i in range(100) if partitions.lane_of(f"lane.c{i}", ()) != lane)
    return first, same, other


async def test_a_job_watch_over_lanes_gives_only_those_lanes(backend: Backend) -> None:
    first, same, other = names_in_two_lanes()
    await backend.jobs.put(spec(first), None)
    await backend.jobs.put(spec(other), None)
    feed = Stream(changes_only(backend.jobs.watch([partitions.lane_of(first, ())])))
    try:
        initial = await feed.until(None)
        assert {e.name for e in initial} == {first}
        assert initial[0].key == partitions.job_key(first, ())
        await backend.jobs.put(spec(other, paused=True), None)  # another lane: not delivered
        written = await backend.jobs.put(spec(same), None)
        event: JobEvent = await feed.next()
        assert (event.name, event.revision) == (same, written)
    finally:
        await feed.close()


async def test_a_job_that_gains_tags_moves_to_the_tagged_lane_as_one_job(backend: Backend) -> None:
    first = await backend.jobs.put(spec("moving"), 0)
    moved = await backend.jobs.put(spec("moving", tags=["gpu"]), first)
    stored = await backend.jobs.get("moving")
    assert stored is not None and stored.revision == moved
    assert stored.spec == spec("moving", tags=["gpu"])
    assert stored.key == partitions.job_key("moving", ["gpu"])
    snapshot = await backend.jobs.snapshot()
    assert [n for n in snapshot if n == "moving"] == ["moving"]
    with pytest.raises(ConflictError):
        await backend.jobs.put(spec("moving"), first)  # the revision read before the move
    await backend.jobs.delete("moving", moved)
    assert await backend.jobs.get("moving") is None
    assert "moving" not in await backend.jobs.snapshot()


async def test_jobs_stored_before_lanes_are_read_moved_and_migrated(
    shared_server: NatsServer,
) -> None:
    bucket = f"legacy{next(_names)}_jobs"
    client = await nats.connect(shared_server.url, connect_timeout=5)
    try:
        js = client.jetstream()
        kv = await js.create_key_value(KeyValueConfig(bucket=bucket, history=5))
        for name in ("old.one", "old.two", "old.tagged"):
            tags = ["gpu"] if name == "old.tagged" else []
            await kv.put(name, encode(spec(name, tags=tags)))
        jobs = JetStreamJobs(js, kv, bucket, lanes=await has_lanes(js, bucket))
        assert not jobs.lanes
        seen = await jobs.get("old.one")
        assert seen is not None and seen.key == "old.one" and seen.spec == spec("old.one")
        # Without lanes a write keeps the bare key: replicas of an older version read it.
        kept = await jobs.put(spec("old.one", paused=True), seen.revision)
        assert (await jobs.get("old.one")).key == "old.one"  # type: ignore[union-attr]
        assert await jobs.migrate() == 3
        assert jobs.lanes and await has_lanes(js, bucket)
        snapshot = await jobs.snapshot()
        assert set(snapshot) == {"old.one", "old.two", "old.tagged"}
        assert snapshot["old.one"].revision > kept
        assert snapshot["old.tagged"].key == partitions.job_key("old.tagged", ["gpu"])
        keys = await live_keys(client, bucket)
        assert {partitions.split_key(k)[0] is None for k in keys} == {False, True}
        assert [k for k in keys if partitions.split_key(k)[0] is None] == [partitions.LAYOUT_KEY]
        assert await jobs.migrate() == 0  # nothing left to move; the marker stays
    finally:
        await client.close()


async def test_a_job_watch_over_lanes_says_how_far_it_has_got(backend: Backend) -> None:
    first, _, other = names_in_two_lanes()
    await backend.jobs.put(spec(first), None)
    feed = Stream(backend.jobs.watch([partitions.lane_of(first, ())]))
    try:
        while await feed.next() is not None:
            pass
        # Writes in a lane it does not watch still move what it can vouch for.
        elsewhere = await backend.jobs.put(spec(other), None)

        async def covered_past() -> bool:
            item = await feed.next(timeout=5)
            return isinstance(item, Covered) and item.revision >= elsewhere

        await wait_for_async(covered_past, timeout=10, message="covered past the other lane")
    finally:
        await feed.close()
