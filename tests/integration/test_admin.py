"""The admin API against replicas on a real nats-server: live job changes, manual triggers,
backfill, compare-and-set, placement, discovery and refusal of every bad request."""

from __future__ import annotations

import itertools
import json
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from harness import wait_for_async
from harness.inprocess_replicas import Cluster, bodies, scheduled_dues
from hrwcron.admin import VERBS, AdminError
from hrwcron.admin.api import ErrorReply
from hrwcron.core.model import JobSpec
from hrwcron.core.ticks import TickId, format_ms

DEADLINE = 20.0


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    c = await Cluster.start(nats_url, {"a": {}, "b": {}, "c": {}})
    yield c
    await c.stop()


def every(name: str, seconds: int = 1, **fields: Any) -> JobSpec:
    return JobSpec(name=name, schedule=f"@every {seconds}s", **fields)


async def wait_ticks(cluster: Cluster, job: str, count: int, **kw: Any) -> list[str]:
    async def enough() -> list[str] | None:
        keys = await cluster.ticks(job)
        return keys if len(keys) >= count else None

    found = await wait_for_async(
        enough, timeout=DEADLINE, interval=0.2, message=f"{count} triggers of {job}", **kw
    )
    assert found is not None
    return found


def assert_exactly_once_without_gaps(keys: list[str], step_ms: int) -> None:
    assert len(keys) == len(set(keys)), f"duplicated ticks: {Counter(keys).most_common(3)}"
    dues = scheduled_dues(keys)
    assert dues == sorted(dues)
    assert all(b - a == step_ms for a, b in itertools.pairwise(dues)), dues


async def test_service_is_discoverable_with_every_endpoint(cluster: Cluster) -> None:
    nc = cluster.client
    info = json.loads((await nc.request("$SRV.INFO.hrwcron", b"", timeout=5)).data)
    assert info["name"] == "hrwcron"
    subjects = {e["subject"] for e in info["endpoints"]}
    assert subjects == {f"hrwcron.admin.{verb}" for verb in VERBS}
    assert {e["queue_group"] for e in info["endpoints"]} == {"hrwcron-admin"}

    # Every replica runs an instance: a PING to the service name is answered by all three.
    inbox = nc.new_inbox()
    pongs: list[dict[str, Any]] = []

    async def collect(msg: Any) -> None:
        pongs.append(json.loads(msg.data))

    await nc.subscribe(inbox, cb=collect)
    await nc.publish("$SRV.PING.hrwcron", b"", reply=inbox)
    await wait_for_async(lambda: len(pongs) == 3, timeout=DEADLINE, message="3 pongs")
    assert sorted(p["metadata"]["node"] for p in pongs) == ["a", "b", "c"]

    await cluster.admin.list_jobs()
    stats_inbox = nc.new_inbox()
    stats: list[dict[str, Any]] = []

    async def collect_stats(msg: Any) -> None:
        stats.append(json.loads(msg.data))

    await nc.subscribe(stats_inbox, cb=collect_stats)
    await nc.publish("$SRV.STATS.hrwcron", b"", reply=stats_inbox)
    await wait_for_async(lambda: len(stats) == 3, timeout=DEADLINE, message="3 stats")
    served = sum(
        e["num_requests"] for s in stats for e in s["endpoints"] if e["name"] == "jobs-list"
    )
    assert served == 1  # the queue group let exactly one replica answer


async def test_live_changes_take_effect_and_untouched_jobs_stay_exactly_once(
    cluster: Cluster,
) -> None:
    admin = cluster.admin
    await admin.put_job(every("steady.one"), 0)
    await admin.put_job(JobSpec(name="steady.two", schedule="*/2 * * * * *"), 0)
    await wait_ticks(cluster, "steady.one", 2)

    # add: fires without any restart
    await admin.put_job(every("live"), 0)
    await wait_ticks(cluster, "live", 2)

    # change: every 2 s from the next tick on
    changed_at = time.time() * 1000
    await admin.put_job(every("live", 2), (await admin.get_job("live")).revision)

    async def two_even_ticks_after_change() -> bool:
        dues = [d for d in scheduled_dues(await cluster.ticks("live")) if d > changed_at + 1000]
        return len(dues) >= 2

    await wait_for_async(two_even_ticks_after_change, timeout=DEADLINE, interval=0.2)
    late = [d for d in scheduled_dues(await cluster.ticks("live")) if d > changed_at + 1000]
    assert all(d % 2000 == 0 for d in late), late

    # pause: nothing more fires while other jobs keep firing
    paused = await admin.pause("live")
    assert paused.paused and paused.changed
    # An act already in flight when the pause landed may still publish the tick it holds.
    pause_ms = time.time() * 1000 + 2000
    before = len(await cluster.ticks("steady.one"))
    await wait_ticks(cluster, "steady.one", before + 4)
    assert not [d for d in scheduled_dues(await cluster.ticks("live")) if d > pause_ms]

    # resume: fires again
    resumed = await admin.pause("live", paused=False)
    assert not resumed.paused and resumed.changed
    resumed_ms = time.time() * 1000

    async def fired_after_resume() -> bool:
        return any(d > resumed_ms for d in scheduled_dues(await cluster.ticks("live")))

    await wait_for_async(fired_after_resume, timeout=DEADLINE, interval=0.2)

    # delete: nothing more fires
    await admin.delete_job("live")
    deleted_ms = time.time() * 1000 + 2000
    before = len(await cluster.ticks("steady.one"))
    await wait_ticks(cluster, "steady.one", before + 4)
    assert not [d for d in scheduled_dues(await cluster.ticks("live")) if d > deleted_ms]
    with pytest.raises(AdminError) as missing:
        await admin.get_job("live")
    assert missing.value.code == "not_found"

    # The untouched jobs: every tick once, none lost, through all of the above.
    assert_exactly_once_without_gaps(await cluster.ticks("steady.one"), 1000)
    assert_exactly_once_without_gaps(await cluster.ticks("steady.two"), 2000)
    live = await cluster.ticks("live")
    assert len(live) == len(set(live))


async def test_trigger_now_goes_through_the_claim_and_never_duplicates(cluster: Cluster) -> None:
    admin = cluster.admin
    await admin.put_job(every("manual.job", 2, payload={"k": 1}), 0)
    await wait_ticks(cluster, "manual.job", 1)

    first = await admin.trigger("manual.job", "rerun-1")
    again = await admin.trigger("manual.job", "rerun-1")
    other = await admin.trigger("manual.job")
    assert first.outcome == "started" and first.tick == "manual.job:manual:rerun-1"
    assert again.outcome == "duplicate"
    assert other.outcome == "started" and other.tick != first.tick

    records = await cluster.stored("manual.job")
    keys = [r.msg_id for r in records]
    assert keys.count("manual.job:manual:rerun-1") == 1
    manual = [b for b in bodies(records) if b.kind == "manual"]
    assert {b.tick for b in manual} == {first.tick, other.tick}
    assert all(b.payload == {"k": 1} for b in manual)

    # Manual triggers never fence the schedule: scheduled ticks keep coming, each once.
    count = len(scheduled_dues(keys))
    await wait_for_async(
        lambda: _more_scheduled(cluster, "manual.job", count + 2), timeout=DEADLINE
    )
    keys = await cluster.ticks("manual.job")
    assert len(keys) == len(set(keys))
    history = await admin.history("manual.job", 3)
    assert [t.tick for t in history.triggers] == list(reversed(keys[-3:]))


async def _more_scheduled(cluster: Cluster, job: str, count: int) -> bool:
    return len(scheduled_dues(await cluster.ticks(job))) >= count


async def test_backfill_publishes_only_what_never_fired(cluster: Cluster) -> None:
    admin = cluster.admin
    await admin.put_job(every("fill", 1, max_lateness=1), 0)
    await wait_ticks(cluster, "fill", 3)
    await admin.pause("fill")
    await wait_for_async(
        lambda: all(r.scheduler.jobs["fill"].spec.paused for r in cluster.replicas.values()),
        timeout=DEADLINE,
        message="every replica saw the pause",
    )
    # A tick published after this read has a later due instant, so it lies outside the range.
    fired = await cluster.ticks("fill")
    first = min(scheduled_dues(fired))
    last = max(scheduled_dues(fired))
    start, end = format_ms(first - 3000), format_ms(last)
    # Nothing inside the lateness window: everything in range is the backfill's to decide.
    await wait_for_async(lambda: time.time() * 1000 > last + 2500, timeout=DEADLINE)

    dry = await admin.backfill("fill", start, end, dry_run=True)
    assert dry.published == [TickId("fill", first - s * 1000).key for s in (3, 2, 1)]
    assert await cluster.ticks("fill") == fired  # a dry run publishes nothing

    result = await admin.backfill("fill", start, end)
    assert result.published == dry.published
    assert sorted(result.present) == sorted(k for k in fired if ":manual:" not in k)
    assert result.left_to_scheduler == []

    again = await admin.backfill("fill", start, end)
    assert again.published == []

    records = await cluster.stored("fill")
    keys = [r.msg_id for r in records]
    assert len(keys) == len(set(keys)) == len(fired) + 3
    assert {b.kind for b in bodies(records[-3:])} == {"backfill"}
    history = await admin.history("fill", 3)
    assert [t.kind for t in history.triggers] == ["backfill"] * 3


async def test_backfill_refuses_bad_ranges_and_publishes_nothing(cluster: Cluster) -> None:
    admin = cluster.admin
    await admin.put_job(every("range", 1), 0)
    now = int(time.time() * 1000)
    cases = [
        (format_ms(now - 2_000_000), format_ms(now - 1000), "too_large", "from"),
        (format_ms(now - 10_000), format_ms(now + 600_000), "bad_request", "to"),
        (format_ms(now - 1000), format_ms(now - 10_000), "bad_request", "to"),
    ]
    for start, end, code, field in cases:
        with pytest.raises(AdminError) as refused:
            await admin.backfill("range", start, end)
        assert (refused.value.code, refused.value.field) == (code, field)
        assert refused.value.message
    backfilled = [b for b in bodies(await cluster.stored("range")) if b.kind == "backfill"]
    assert backfilled == []


async def test_stale_compare_and_set_edit_is_refused(cluster: Cluster) -> None:
    admin = cluster.admin
    created = await admin.put_job(every("cas", 60), 0)
    assert created.created
    mine = await admin.put_job(every("cas", 30), created.revision)
    with pytest.raises(AdminError) as stale:
        await admin.put_job(every("cas", 90), created.revision)
    assert (stale.value.code, stale.value.field) == ("conflict", "revision")
    assert "revision" in stale.value.message
    with pytest.raises(AdminError) as exists:
        await admin.put_job(every("cas", 90), 0)
    assert exists.value.code == "conflict"
    with pytest.raises(AdminError) as stale_delete:
        await admin.delete_job("cas", created.revision)
    assert stale_delete.value.code == "conflict"

    entry = await admin.get_job("cas")
    assert entry.revision == mine.revision
    assert entry.spec is not None and entry.spec.schedule == "@every 30s"


BIG = "x" * (70 * 1024)
BAD_REQUESTS: list[tuple[str, Any, str, str]] = [
    ("jobs.put", b"{not json", "bad_request", ""),
    ("jobs.put", {"spec": {"name": "ok", "schedule": "@hourly"}, "revison": 1}, "bad_request",
     "revison"),
    ("jobs.put", {"spec": {"name": "bad name", "schedule": "@hourly"}}, "bad_request",
     "spec.name"),
    ("jobs.put", {"spec": {"name": "ok", "schedule": "61 * * * *"}}, "bad_request",
     "spec.schedule"),
    ("jobs.put", {"spec": {"name": "ok", "schedule": "@hourly", "tz": "Mars/Olympus"}},
     "bad_request", "spec.tz"),
    ("jobs.put", {"spec": {"name": "ok", "schedule": "@hourly", "payload": BIG}}, "bad_request",
     "spec.payload"),
    ("jobs.put", {"spec": {"name": "ok", "schedule": "@hourly", "subject": "other.x"}},
     "bad_request", "spec.subject"),
    ("jobs.put", {"spec": {"name": "ok", "schedule": "@hourly", "max_lateness": 3600}},
     "bad_request", "spec.max_lateness"),
    ("jobs.put", {"spec": {"name": "ok", "schedule": "@hourly", "catchup": "some"}},
     "bad_request", "spec.catchup"),
    ("jobs.put", {"spec": {"name": "ok", "schedule": "@hourly"}, "revision": -1},
     "bad_request", "revision"),
    ("jobs.put", {"spec": {"name": "ok2", "schedule": "@hourly",
                           "subject": "hrwcron.trigger.existing"}}, "conflict", "spec.subject"),
    ("jobs.get", {}, "bad_request", "name"),
    ("jobs.get", {"name": "a.*"}, "bad_request", "name"),
    ("jobs.get", {"name": "missing"}, "not_found", "name"),
    ("jobs.delete", {"name": "missing"}, "not_found", "name"),
    ("jobs.pause", {"name": "missing"}, "not_found", "name"),
    ("jobs.resume", {"name": "existing", "revision": 0}, "bad_request", "revision"),
    ("jobs.list", {"limit": "many"}, "bad_request", "limit"),
    ("jobs.list", {"limit": 0}, "bad_request", "limit"),
    ("trigger", {"name": "existing", "id": "has space"}, "bad_request", "id"),
    ("trigger", {"name": "existing", "id": "a.b"}, "bad_request", "id"),
    ("trigger", {"name": "missing"}, "not_found", "name"),
    ("backfill", {"name": "existing", "from": "2026-01-01T00:00:00", "to": "2026-01-02T00:00:00Z"},
     "bad_request", "from"),
    ("backfill", {"name": "existing", "to": "2026-01-02T00:00:00Z"}, "bad_request", "from"),
    ("status", {"limit": 10**9}, "bad_request", "limit"),
    ("status", {"name": "missing"}, "not_found", "name"),
    ("history", {"name": "existing", "limit": 0}, "bad_request", "limit"),
    ("history", {"name": "missing"}, "not_found", "name"),
]  # fmt: skip


async def test_every_bad_request_gets_a_structured_error_and_changes_nothing(
    cluster: Cluster,
) -> None:
    admin = cluster.admin
    await admin.put_job(JobSpec(name="existing", schedule="@hourly"), 0)
    store = await cluster.jobs_store()
    before = await store.snapshot()
    stream_before = (await cluster.client.jetstream().stream_info("HRWCRON_TRIGGERS")).state
    for verb, body, code, field in BAD_REQUESTS:
        data = body if isinstance(body, bytes) else msgspec.json.encode(body)
        reply = await cluster.client.request(f"hrwcron.admin.{verb}", data, timeout=10)
        headers = reply.headers or {}
        error = msgspec.json.decode(reply.data, type=ErrorReply).error
        where = f"{verb} {body!r:.80}"
        assert (error.code, error.field) == (code, field), f"{where}: {error}"
        assert error.message, where
        assert headers.get("Nats-Service-Error-Code"), where
        assert headers.get("Nats-Service-Error"), where
    assert await store.snapshot() == before
    stream_after = (await cluster.client.jetstream().stream_info("HRWCRON_TRIGGERS")).state
    assert stream_after.messages == stream_before.messages


async def test_tags_restrict_candidates(nats_url: str) -> None:
    cluster = await Cluster.start(
        nats_url, {"a": {"tags": ["gpu"]}, "b": {}, "c": {"tags": ["gpu", "eu"]}}
    )
    try:
        admin = cluster.admin
        await admin.put_job(every("tagged", tags=["gpu"]), 0)
        await admin.put_job(every("nowhere", tags=["tpu"]), 0)
        await admin.put_job(every("anywhere"), 0)
        records = await _wait_records(cluster, "tagged", 6)
        assert {b.node for b in bodies(records)} <= {"a", "c"}
        status = await admin.status()
        jobs = {j.name: j for j in status.jobs}
        assert set(jobs["tagged"].order) == {"a", "c"}
        assert jobs["nowhere"].owner is None and jobs["nowhere"].order == []
        assert set(jobs["anywhere"].order) == {"a", "b", "c"}
        assert {m.node: m.tags for m in status.members} == {
            "a": ["gpu"],
            "b": [],
            "c": ["gpu", "eu"],
        }
        assert await cluster.ticks("nowhere") == []
    finally:
        await cluster.stop()


async def _wait_records(cluster: Cluster, job: str, count: int) -> Any:
    async def enough() -> Any:
        records = await cluster.stored(job)
        return records if len(records) >= count else None

    return await wait_for_async(enough, timeout=DEADLINE, interval=0.2)


async def test_weighted_shares_in_status_follow_the_weights(nats_url: str) -> None:
    weights = {"w1": 1.0, "w2": 2.0, "w3": 3.0}
    cluster = await Cluster.start(nats_url, {n: {"weight": w} for n, w in weights.items()})
    try:
        store = await cluster.jobs_store()
        total = 600
        for i in range(total):
            await store.put(JobSpec(name=f"share.{i:04d}", schedule="@yearly", paused=True), 0)

        async def all_loaded() -> Any:
            status = await cluster.admin.status(prefix="share.", limit=total)
            return status if status.total_jobs == total else None

        status = await wait_for_async(all_loaded, timeout=DEADLINE, interval=0.2)
        assert {m.node: m.weight for m in status.members} == weights
        owners = Counter(j.owner for j in status.jobs)
        expected = {n: total * w / sum(weights.values()) for n, w in weights.items()}
        chi2 = sum((owners[n] - e) ** 2 / e for n, e in expected.items())
        # 2 degrees of freedom: 13.8 is the 0.999 quantile.
        assert chi2 < 13.8, (owners, expected)
        assert owners["w3"] > owners["w2"] > owners["w1"]
    finally:
        await cluster.stop()


async def test_a_request_whose_reply_subject_is_no_inbox_is_dropped_and_counted(
    nats_url: str,
) -> None:
    """A requester in the replicas' own account could name a trigger subject or a bucket key
    as its reply subject and have a replica publish there with its own rights: the replica
    answers only inboxes (a client's _INBOX.… or an import's _R_.…)."""
    cluster = await Cluster.start(nats_url, {"a": {}})
    try:
        await cluster.admin.put_job(every("inbox.victim", 3600))
        replica = cluster.replicas["a"]
        assert replica.admin is not None
        nc = cluster.client
        landed: list[str] = []

        async def record(msg: Any) -> None:
            landed.append(msg.subject)

        targets = ["hrwcron.trigger.inbox.victim.forged", "$KV.hrwcron_members.forged"]
        for target in targets:
            await nc.subscribe(target, cb=record)
        request = msgspec.json.encode({"name": "inbox.victim"})
        for target in targets:
            await nc.publish("hrwcron.admin.jobs.get", request, reply=target)
        await wait_for_async(
            lambda: replica.admin is not None and replica.admin.refused_replies == len(targets),
            timeout=DEADLINE,
            message="both requests refused",
        )
        # The same request on an inbox is answered; anything sent before it has been handled.
        answer = await nc.request("hrwcron.admin.jobs.get", request, timeout=5)
        assert b"inbox.victim" in answer.data
        await nc.flush()
        assert landed == []
        assert replica.telemetry is None or (
            replica.telemetry.registry.get_sample_value("hrwcron_admin_refused_replies_total")
            == len(targets)
        )
        js = nc.jetstream()
        with pytest.raises(Exception, match="no message found"):
            await js.get_last_msg("HRWCRON_TRIGGERS", targets[0])
    finally:
        await cluster.stop()
