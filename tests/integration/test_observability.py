"""Observability on a real nats-server: /metrics agrees with the trigger stream, /readyz follows
the NATS connection, and the status page renders a live run in a real browser, inert however
much HTML the job specs hold."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import nats
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import NatsServer, live_keys, wait_for_async
from hrwcron import __version__
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.core.errors import HrwcronError
from hrwcron.core.model import JobSpec
from hrwcron.process.app import Replica, start_replica

CHROMIUM = "/usr/bin/chromium"
STREAM = "HRWCRON_TRIGGERS"
# Each would leave a visible mark in the DOM if the page ever let it run.
HOSTILE_SCRIPT = (
    "<script>document.title='pwned';"
    "document.body.appendChild(document.createElement('pwned-script'))</script>"
)
HOSTILE_IMG = (
    "<img src=x onerror=\"document.body.appendChild(document.createElement('pwned-img'))\">"
)
JOBS = [
    JobSpec(name="obs.every", schedule="@every 1s", description="plain job"),
    JobSpec(
        name="obs.hostile",
        schedule="*/2 * * * * *",
        description=HOSTILE_SCRIPT,
        payload={"html": HOSTILE_IMG, "more": HOSTILE_SCRIPT},
        tags=[],
    ),
]


def config(url: str, node: str, jobs: list[JobSpec]) -> Config:
    return Config(
        nats=NatsConfig(servers=[url], connect_timeout=2.0),
        scheduler=SchedulerConfig(node_id=node),
        http=HttpConfig(listen="127.0.0.1:0"),
        jobs=jobs,
    )


def fetch(url: str) -> tuple[int, str]:
    """Blocking GET; call through asyncio.to_thread, the replicas share this event loop."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def get(replica: Replica, path: str) -> tuple[int, str]:
    assert replica.http is not None
    return await asyncio.to_thread(fetch, replica.http.url + path)


async def scrape(replica: Replica) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = await get(replica, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


@pytest.fixture
async def two_replicas(nats_server: NatsServer) -> AsyncIterator[list[Replica]]:
    replicas: list[Replica] = []
    try:
        for node in ("obs-a", "obs-b"):
            replicas.append(await start_replica(config(nats_server.url, node, JOBS), {}))
        yield replicas
    finally:
        for replica in replicas:
            await replica.stop()


async def test_metrics_count_what_the_stream_holds(
    two_replicas: list[Replica], nats_server: NatsServer
) -> None:
    client = await nats.connect(nats_server.url)
    try:
        js = client.jetstream()

        async def enough_triggers() -> bool:
            info = await js.stream_info(STREAM)
            return info.state.messages >= 8

        await wait_for_async(enough_triggers, timeout=60, message="8 triggers in the stream")

        async def both_live() -> bool:
            scraped = [await scrape(r) for r in two_replicas]
            # Every job has exactly one owner: the owned counts add up to the job count.
            owned = sum(value(s, "hrwcron_owned_jobs") for s in scraped)
            return owned == len(JOBS) and all(
                value(s, "hrwcron_live_members") == 2 for s in scraped
            )

        await wait_for_async(
            both_live, timeout=30, message="2 live members and one owner per job, on both"
        )
        # Stop firing but keep serving: the counters are final, the endpoint still answers.
        for replica in two_replicas:
            await replica.scheduler.stop()
        info = await js.stream_info(STREAM, subjects_filter=">")
        per_subject = dict(info.state.subjects or {})
    finally:
        await client.close()

    scraped = [await scrape(replica) for replica in two_replicas]
    started = sum(
        value(s, "hrwcron_ticks_total", outcome="started", job_name=j.name)
        for s in scraped
        for j in JOBS
    )
    assert started == info.state.messages, (started, info.state.messages)
    for job in JOBS:
        in_stream = per_subject.get(job.trigger_subject(), 0)
        counted = sum(
            value(s, "hrwcron_ticks_total", outcome="started", job_name=job.name) for s in scraped
        )
        assert counted == in_stream, (job.name, counted, in_stream)
        assert in_stream > 0
    # Each tick was decided once, by its owner: the other replica left it to the owner's
    # progress marks and spent no decision on it (a few at most, before the first marks).
    others = sum(
        value(s, "hrwcron_ticks_total", outcome=outcome, job_name=job.name)
        for s in scraped
        for job in JOBS
        for outcome in ("not_owner", "already_claimed", "lock_busy")
    )
    assert others < started / 4, (others, started)
    for samples in scraped:
        assert value(samples, "hrwcron_nats_connected") == 1
        assert value(samples, "hrwcron_job_digest_mismatch") == 0
        assert 0 <= value(samples, "hrwcron_heartbeat_age_seconds") < 3
        assert abs(value(samples, "hrwcron_clock_offset_seconds")) < 1
    lateness = sum(value(s, "hrwcron_tick_lateness_seconds_count") for s in scraped)
    assert lateness == started  # every started tick has its lateness recorded
    builds = [k for s in scraped for k in s if k[0] == "hrwcron_build_info"]
    assert {dict(labels)["node"] for _, labels in builds} == {"obs-a", "obs-b"}


async def test_readyz_follows_the_nats_server(nats_server: NatsServer) -> None:
    replica = await start_replica(config(nats_server.url, "obs-solo", JOBS[:1]), {})
    try:

        async def readyz(expected: int) -> dict[str, object] | None:
            status, body = await get(replica, "/readyz")
            return json.loads(body) if status == expected else None

        assert await wait_for_async(lambda: readyz(200), timeout=30, message="/readyz 200")
        await asyncio.to_thread(nats_server.stop)
        down = await wait_for_async(lambda: readyz(503), timeout=30, message="/readyz 503")
        assert down["ready"] is False
        assert down["reason"]
        assert value(await scrape(replica), "hrwcron_nats_connected") == 0
        await asyncio.to_thread(nats_server.start)
        up = await wait_for_async(lambda: readyz(200), timeout=90, message="/readyz 200 again")
        assert up == {"ready": True}
        samples = await scrape(replica)
        assert value(samples, "hrwcron_nats_connected") == 1
        assert value(samples, "hrwcron_nats_reconnects_total") >= 1
        assert value(samples, "hrwcron_ready") == 1
    finally:
        await replica.stop()


async def dump_dom(url: str, profile: Path) -> str:
    """The DOM headless Chromium builds for ``url``, after its scripts ran."""
    process = await asyncio.create_subprocess_exec(
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--no-first-run",
        f"--user-data-dir={profile}",
        "--dump-dom",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, err.decode()[-2000:]
    return out.decode()


async def test_the_console_in_chromium_shows_the_run_and_stays_inert(
    two_replicas: list[Replica], tmp_path: Path
) -> None:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.skip(f"{CHROMIUM} not found: install Debian's chromium package (make system-deps)")
    first = two_replicas[0]

    async def status_complete() -> bool:
        status, body = await get(first, "/status")
        doc = json.loads(body)
        live = {m["node"] for m in doc["members"] if m["live"]}
        fired = all(job["last"] is not None for job in doc["jobs"])
        return status == 200 and live == {"obs-a", "obs-b"} and fired

    await wait_for_async(status_complete, timeout=60, message="both members live, jobs fired")
    assert first.http is not None

    async def counted() -> bool:  # the first view starts the walk over the jobs
        status, body = await get(first, "/")
        return status == 200 and 'id="timeline"' in body

    await wait_for_async(counted, timeout=30, message="the next hour's ticks counted")
    fleet = await dump_dom(first.http.url + "/", tmp_path / "chromium")
    assert "<title>fleet · hrwcron obs-a</title>" in fleet
    members = fleet[
        fleet.index('id="members"') : fleet.index("</table>", fleet.index('id="members"'))
    ]
    assert "obs-a" in members and "obs-b" in members
    assert 'id="timeline"' in fleet
    for path in ("/jobs", "/jobs/obs.hostile"):
        dom = await dump_dom(first.http.url + path, tmp_path / "chromium")
        assert "pwned" not in dom.split("<title>")[1].split("</title>")[0]  # not renamed
        assert "<pwned-img" not in dom and "<pwned-script" not in dom
        # The one script is the console's own, from the package; theirs is text.
        ours = f'<script src="/static/console.js?v={__version__}" defer="">'
        assert re.findall(r"<script[^>]*>", dom) == [ours]
        assert "&lt;script&gt;document.title='pwned'" in dom
    jobs = await dump_dom(first.http.url + "/jobs", tmp_path / "chromium")
    assert "obs.every" in jobs and "obs.hostile" in jobs


async def test_a_taken_http_port_stops_the_start_before_joining(nats_server: NatsServer) -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        taken = config(nats_server.url, "obs-blocked", JOBS[:1])
        taken = msgspec.structs.replace(taken, http=HttpConfig(listen=f"127.0.0.1:{port}"))
        with pytest.raises(HrwcronError, match=f"http.listen 127.0.0.1:{port}"):
            await start_replica(taken, {})
    client = await nats.connect(nats_server.url)
    try:
        assert "obs-blocked" not in await live_keys(client, "hrwcron_members")
    finally:
        await client.close()
