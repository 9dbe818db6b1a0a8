"""Replicas that hold a share (scheduler.holders = 2) on a real nats-server: each holds only its
lanes' jobs, any replica answers the admin API about any job, and ticks fire exactly once."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

import msgspec
import nats
import pytest

from harness import wait_for_async
from harness.inprocess_replicas import Cluster, replica_config, scheduled_dues
from harness.nats import http_get
from hrwcron.admin import AdminClient, AdminError
from hrwcron.admin.replies import ApiError
from hrwcron.core import partitions
from hrwcron.core.config import HttpConfig
from hrwcron.core.model import JobSpec
from hrwcron.process.app import start_replica

DEADLINE = 20.0
NODES = ("a", "b", "c")


@pytest.fixture
async def cluster(nats_url: str) -> AsyncIterator[Cluster]:
    c = await Cluster.start(nats_url, {node: {"holders": 2} for node in NODES})
    yield c
    await c.stop()


def held_by(cluster: Cluster, name: str) -> list[str]:
    return sorted(n for n, r in cluster.replicas.items() if name in r.scheduler.jobs)


async def put_and_hold(cluster: Cluster, names: list[str], schedule: str) -> None:
    """Write the jobs through the admin API, until each is held by its lane's two holders."""
    for name in names:
        await cluster.admin.put_job(JobSpec(name=name, schedule=schedule))
    await wait_for_async(
        lambda: all(len(held_by(cluster, n)) == 2 for n in names),
        timeout=DEADLINE,
        message="each job held by its lane's two holders",
    )


async def test_a_job_is_held_by_two_of_three_and_answered_by_any(cluster: Cluster) -> None:
    names = [f"share.j{i}" for i in range(12)]
    await put_and_hold(cluster, names, "@every 1s")
    held = {n: len(r.scheduler.jobs) for n, r in cluster.replicas.items()}
    assert all(count < len(names) for count in held.values()), held
    # Whichever replica the queue group picks, every job is found, paused and resumed.
    for name in names:
        entry = await cluster.admin.get_job(name)
        assert entry.name == name
        status = await cluster.admin.status(name=name)
        assert [job.name for job in status.jobs] == [name]
        assert status.jobs[0].owner in held_by(cluster, name)
    sent_on = sum(r.admin.sent_on for r in cluster.replicas.values() if r.admin is not None)
    assert sent_on > 0  # 36 requests to three replicas: some reached one without the job
    paused = await cluster.admin.pause(names[0])
    assert paused.paused and paused.changed
    resumed = await cluster.admin.pause(names[0], paused=False)
    assert not resumed.paused and resumed.changed
    with pytest.raises(AdminError) as missing:
        await cluster.admin.get_job("share.nobody")
    assert missing.value.code == "not_found"


async def test_a_manual_trigger_and_the_schedule_fire_once_whoever_is_asked(
    cluster: Cluster,
) -> None:
    spec = JobSpec(name="share.fired", schedule="@every 1s")
    await cluster.admin.put_job(spec)
    triggered = [await cluster.admin.trigger(spec.name, f"once-{i}") for i in range(4)]
    assert all(t.outcome == "started" for t in triggered)
    again = await cluster.admin.trigger(spec.name, "once-0")
    assert again.outcome == "duplicate"

    async def five_ticks() -> list[str] | None:
        keys = [k for k in await cluster.ticks(spec.name) if ":manual:" not in k]
        return keys if len(keys) >= 5 else None

    keys = await wait_for_async(five_ticks, timeout=DEADLINE, interval=0.2, message="5 ticks")
    assert keys is not None
    scheduled = [k for k in keys if k.count(":") == 1]
    assert len(scheduled) == len(set(scheduled))
    dues = scheduled_dues(scheduled)
    assert dues == sorted(dues)
    assert all(b - a == 1000 for a, b in itertools.pairwise(dues)), dues


async def test_jobs_are_stored_in_their_lanes(cluster: Cluster) -> None:
    await cluster.admin.put_job(JobSpec(name="share.keyed", schedule="@hourly"))
    stored = await (await cluster.jobs_store()).get("share.keyed")
    assert stored is not None
    assert stored.key == partitions.job_key("share.keyed", [])


async def test_a_listing_pages_through_every_job_whoever_holds_it(cluster: Cluster) -> None:
    names = sorted(f"listed.j{i:02d}" for i in range(30))
    specs = [JobSpec(name=n, schedule="@hourly") for n in names]
    puts, _ = await cluster.admin.write_jobs([(spec, None) for spec in specs])
    assert {p.outcome for p in puts} == {"created"}
    # Written again as they are, every one is found unchanged, whoever holds it.
    again, _ = await cluster.admin.write_jobs([(spec, None) for spec in specs])
    assert {p.outcome for p in again} == {"unchanged"}
    # Small pages, by count and by bytes, so pages of several replicas are merged and cut.
    for limit, max_bytes in ((7, 0), (1000, 600)):
        found: list[str] = []
        after = ""
        while True:
            page = await cluster.admin.list_jobs("listed.", after, limit=limit, max_bytes=max_bytes)
            assert page.total == len(names)
            found += [entry.name for entry in page.jobs]
            if not page.next:
                break
            after = page.next
        assert found == names
    everything = await cluster.admin.all_jobs("listed.")
    assert [entry.name for entry in everything] == names


async def test_an_in_process_call_about_a_job_held_elsewhere_goes_to_a_holder(
    cluster: Cluster,
) -> None:
    """What the console does: AdminService.call on the replica that serves the page."""
    names = [f"called.j{i}" for i in range(12)]
    await put_and_hold(cluster, names, "@hourly")
    name = names[0]
    outsider = next(r for n, r in cluster.replicas.items() if n not in held_by(cluster, name))
    assert outsider.admin is not None
    before = outsider.admin.sent_on
    result = await outsider.admin.call("jobs.pause", b'{"name": "%s"}' % name.encode())
    assert result.paused and result.changed  # type: ignore[attr-defined]
    assert outsider.admin.sent_on == before + 1
    with pytest.raises(ApiError) as refused:
        await outsider.admin.call("jobs.pause", b'{"name": "%s", "revision": 1}' % name.encode())
    assert refused.value.code == "conflict"


async def test_status_pages_through_every_job_and_adds_up_every_share(cluster: Cluster) -> None:
    names = sorted(f"state.j{i:02d}" for i in range(30))
    specs = [JobSpec(name=n, schedule="@hourly", paused=n.endswith("7")) for n in names]
    await cluster.admin.write_jobs([(spec, None) for spec in specs])
    await wait_for_async(
        lambda: all(len(held_by(cluster, n)) == 2 for n in names),
        timeout=DEADLINE,
        message="each job held by its lane's two holders",
    )
    # No replica holds every job, yet whichever answers counts every one once.
    assert all(len(r.scheduler.jobs) < len(names) for r in cluster.replicas.values())

    async def counted() -> bool:
        summary = (await cluster.admin.status(prefix="state.", limit=1)).summary
        return sum(summary.owned.values()) == len(names)

    await wait_for_async(counted, timeout=DEADLINE, message="every job's owner counted")
    for _ in range(3):
        reply = await cluster.admin.status(prefix="state.", limit=1)
        assert reply.total_jobs == len(names)
        assert reply.summary.jobs == len(names)
        assert reply.summary.paused == sum(spec.paused for spec in specs)
        assert set(reply.summary.owned) <= set(NODES)
        assert reply.cursors == []
    # Small pages, by count and by bytes, in name and in due order: each job once, in order.
    for order, limit, max_bytes in (("name", 7, 0), ("due", 4, 0), ("due", 1000, 900)):
        found: list[str] = []
        fires: list[tuple[str, str]] = []
        after = ""
        while True:
            page = await cluster.admin.status(
                prefix="state.", limit=limit, after=after, max_bytes=max_bytes, order=order
            )
            found += [job.name for job in page.jobs]
            fires += [(job.next_fire or "~", job.name) for job in page.jobs]
            assert all(job.owner in held_by(cluster, job.name) for job in page.jobs)
            if not page.next:
                assert not page.truncated
                break
            after = page.next
        assert sorted(found) == names and len(found) == len(names), order
        assert found == names if order == "name" else fires == sorted(fires)


async def test_a_console_without_the_job_shows_its_page_and_says_what_its_list_covers(
    nats_url: str,
) -> None:
    """The console of a replica that does not hold a job: the job's page says where it stands
    (asked of a holder) and when it fires next; its list says it covers this replica's share,
    and a search for the job's full name links to its page."""
    replicas = []
    try:
        for node in NODES:
            config = msgspec.structs.replace(
                replica_config(nats_url, node, holders=2),
                http=HttpConfig(listen="127.0.0.1:0"),
            )
            replicas.append(await start_replica(config, {}))
        by_node = {r.scheduler.node: r for r in replicas}
        await wait_for_async(
            lambda: all(sorted(r.scheduler.ranking_of("any")) == list(NODES) for r in replicas),
            timeout=DEADLINE,
            message="every replica sees the others",
        )
        names = [f"paged.j{i}" for i in range(12)]
        admin = AdminClient(replicas[0].stores.client, timeout=10.0)
        for name in names:
            await admin.put_job(JobSpec(name=name, schedule="*/5 * * * *"))

        def holders(name: str) -> list[str]:
            return sorted(n for n, r in by_node.items() if name in r.scheduler.jobs)

        await wait_for_async(
            lambda: all(len(holders(n)) == 2 for n in names), timeout=DEADLINE, message="held"
        )
        name = names[0]
        (outsider,) = [r for n, r in by_node.items() if n not in holders(name)]
        assert outsider.http is not None
        base = outsider.http.url

        status, body = await asyncio.to_thread(http_get, f"{base}/jobs/{name}")
        page = body.decode()
        assert status == 200, page[:500]
        assert "not running here" not in page
        assert 'id="standing"' in page and "fires next" in page
        assert any(f">{holder}<" in page for holder in holders(name)), page[:2000]
        assert "*/5" in page or ":05:00" in page or ":00:00" in page  # its next ticks listed

        status, body = await asyncio.to_thread(http_get, f"{base}/jobs?q={name}")
        listing = body.decode()
        assert status == 200
        assert 'id="share"' in listing and "its share" in listing
        assert 'id="elsewhere"' in listing and f'href="/jobs/{name}"' in listing
        held_here = next(n for n in names if outsider.scheduler.node in holders(n))
        status, body = await asyncio.to_thread(http_get, f"{base}/jobs?q={held_here}")
        assert 'id="elsewhere"' not in body.decode()
    finally:
        for replica in replicas:
            await replica.stop()


async def test_a_restarted_fleet_reads_its_shares_newest_triggers_and_fires_each_tick_once(
    nats_url: str,
) -> None:
    names = [f"restart.j{i:02d}" for i in range(24)]
    nodes = {node: {"holders": 2} for node in NODES}
    first = await Cluster.start(nats_url, nodes)
    try:
        for name in names:
            await first.admin.put_job(JobSpec(name=name, schedule="@every 1s", max_lateness=60))

        async def every_job_fired() -> bool:
            return all([await first.ticks(name) for name in names])

        await wait_for_async(every_job_fired, timeout=DEADLINE, message="every job fired")
    finally:
        await first.stop()
    reader = Cluster(nats_url)  # no replica: only what the stream holds now
    reader.nc = await nats.connect(nats_url)
    try:
        newest = {name: scheduled_dues(await reader.ticks(name))[-1] for name in names}
    finally:
        await reader.stop()
    second = await Cluster.start(nats_url, nodes)
    try:
        # Each newest trigger lies inside the lateness window: planned without reading it, a
        # replica would take its tick for one still to resolve.
        for node, replica in second.replicas.items():
            held = {job.subject: job for job in replica.scheduler.jobs.values()}
            assert set(replica.scheduler.last) <= set(held), node  # its share's subjects only
            for job in held.values():
                if job.spec.name in newest:
                    assert job.due is not None and job.due > newest[job.spec.name], node

        async def two_more_each() -> bool:
            for name in names:
                if scheduled_dues(await second.ticks(name))[-1] < newest[name] + 2000:
                    return False
            return True

        await wait_for_async(two_more_each, timeout=DEADLINE, message="two more ticks of each")
        for name in names:
            dues = scheduled_dues(await second.ticks(name))
            assert len(dues) == len(set(dues)), name  # no tick twice, across the restart
            assert all(b - a == 1000 for a, b in itertools.pairwise(dues)), (name, dues)
        redone = [
            d for r in second.recorders.values() for d in r.decisions if d.due_ms <= newest[d.job]
        ]
        assert redone == []
    finally:
        await second.stop()
