"""Identities no two jobs or ticks may share, on real replicas: a trigger subject (held by a
create-only claim written with the job), a manual trigger id (for as long as the stream keeps
the job's triggers) and a claim key."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from harness import wait_for_async
from harness.inprocess_replicas import Cluster
from hrwcron.adapters.jetstream.jobs import SUBJECT_CLAIM, JetStreamJobs, SubjectClaim
from hrwcron.adapters.jetstream.kv import conditional_put
from hrwcron.admin import AdminError
from hrwcron.core import partitions
from hrwcron.core.errors import SubjectTakenError
from hrwcron.core.model import JobSpec, encode

DEADLINE = 30.0

# --- subjects are unique by construction ---------------------------------------------------


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    c = await Cluster.start(nats_url, {"a": {}, "b": {}, "c": {}})
    yield c
    await c.stop()


async def test_concurrent_puts_of_one_subject_let_exactly_one_job_have_it(
    cluster: Cluster,
) -> None:
    admin = cluster.admin
    for round_ in range(8):
        subject = f"hrwcron.trigger.shared.r{round_}"
        names = [f"rival.r{round_}.n{i}" for i in range(4)]
        results = await asyncio.gather(
            *(admin.put_job(JobSpec(name=n, schedule="@hourly", subject=subject)) for n in names),
            return_exceptions=True,
        )
        won = [r for r in results if not isinstance(r, BaseException)]
        lost = [r for r in results if isinstance(r, BaseException)]
        assert len(won) == 1, results
        for error in lost:
            assert isinstance(error, AdminError), error
            assert (error.code, error.field) == ("conflict", "spec.subject"), error
    entries = await admin.all_jobs("rival.")
    subjects = [e.spec.trigger_subject() for e in entries if e.spec is not None]
    assert len(entries) == 8 and len(set(subjects)) == 8


async def test_a_subject_claim_is_taken_over_once_its_job_no_longer_uses_it(
    cluster: Cluster,
) -> None:
    js = cluster.client.jetstream()
    store = JetStreamJobs(
        js, await js.key_value("hrwcron_jobs"), "hrwcron_jobs", claims_bucket="hrwcron_claims"
    )
    claims = await js.key_value("hrwcron_claims")
    s1, s2 = "hrwcron.trigger.s.one", "hrwcron.trigger.s.two"
    # Left by a write that crashed between the claim and the job: its job never appeared.
    await claims.put(SUBJECT_CLAIM + s1, encode(SubjectClaim(job="ghost")))
    await store.put(JobSpec(name="first", schedule="@hourly", subject=s1), 0)
    assert (await store.get("ghost")) is None  # taken over, and the ghost stays gone
    with pytest.raises(SubjectTakenError):
        await store.put(JobSpec(name="second", schedule="@hourly", subject=s1), 0)
    # first moves on to s2: s1 is free again, s2 is not.
    await store.put(JobSpec(name="first", schedule="@hourly", subject=s2), None)
    await store.put(JobSpec(name="second", schedule="@hourly", subject=s1), 0)
    with pytest.raises(SubjectTakenError):
        await store.put(JobSpec(name="third", schedule="@hourly", subject=s2), 0)
    # A deleted job leaves its subject to the next one.
    await store.delete("first", None)
    await store.put(JobSpec(name="third", schedule="@hourly", subject=s2), 0)
    # A default subject counts too: no custom subject may take a job's own.
    await store.put(JobSpec(name="plain", schedule="@hourly"), 0)
    with pytest.raises(SubjectTakenError):
        await store.put(
            JobSpec(name="fourth", schedule="@hourly", subject="hrwcron.trigger.plain"), 0
        )


async def test_a_take_over_makes_the_stale_holders_late_write_fail(cluster: Cluster) -> None:
    """The race a take-over must not lose: the holder claimed the subject and its job write
    is still in flight when another job finds the claim stale."""
    js = cluster.client.jetstream()
    store = JetStreamJobs(
        js, await js.key_value("hrwcron_jobs"), "hrwcron_jobs", claims_bucket="hrwcron_claims"
    )
    subject = "hrwcron.trigger.contested"
    # The slow writer read "slow" as absent (revision 0) and holds the claim...
    assert await store._hold_subject(subject, "slow", "hrwcron_claims")
    # ...when a rival takes it over: the claim's job does not use the subject (yet).
    await store.put(JobSpec(name="rival", schedule="@hourly", subject=subject), 0)
    # The slow write lands now, compare-and-set on the revision it read, and must fail.
    late = encode(JobSpec(name="slow", schedule="@hourly", subject=subject))
    key = partitions.job_key("slow", [])
    assert await conditional_put(js, "hrwcron_jobs", key, late, 0, None) is None
    # Writing it again the normal way says who has the subject.
    with pytest.raises(SubjectTakenError, match="rival"):
        await store.put(JobSpec(name="slow", schedule="@hourly", subject=subject), None)


# --- manual trigger ids and claim keys ------------------------------------------------------


async def test_a_repeated_trigger_id_publishes_nothing_after_claim_and_window_expire(
    cluster: Cluster,
) -> None:
    admin = cluster.admin
    await admin.put_job(JobSpec(name="once", schedule="@hourly"), 0)
    first = await admin.trigger("once", "same")
    assert first.outcome == "started"
    # Forget it everywhere but in the stream: the claim expires (here: purged) and the
    # stream's duplicate window passes (here: shortened to one second).
    js = cluster.client.jetstream()
    # A purge of the stream, not of the key: an expired claim leaves no marker behind.
    await js.purge_stream("KV_hrwcron_claims", subject="$KV.hrwcron_claims.once.manual.same")
    info = await js.stream_info("HRWCRON_TRIGGERS")
    info.config.duplicate_window = 1.0
    await js.update_stream(info.config)
    stored = (await cluster.stored("once"))[-1].stored_ms
    await wait_for_async(
        lambda: time.time() * 1000 > stored + 1_500,
        timeout=DEADLINE,
        message="the shortened duplicate window to pass",
    )
    again = await admin.trigger("once", "same")
    assert again.outcome == "duplicate"
    assert [r.msg_id for r in await cluster.stored("once")] == ["once:manual:same"]
    other = await admin.trigger("once", "other")
    assert other.outcome == "started"


async def test_a_manual_id_and_a_backfill_no_longer_share_a_claim(cluster: Cluster) -> None:
    admin = cluster.admin
    await admin.put_job(JobSpec(name="sec", schedule="*/5 * * * * *"), 0)
    await admin.put_job(JobSpec(name="sec.manual", schedule="*/5 * * * * *"), 0)
    manual = await admin.trigger("sec", "-5000")
    assert manual.outcome == "started"
    result = await admin.backfill("sec.manual", "1969-12-31T23:59:55Z", "1969-12-31T23:59:55Z")
    assert (result.published, result.present) == (["sec.manual:-5000"], [])
    assert [r.msg_id for r in await cluster.stored("sec.manual")] == ["sec.manual:-5000"]
