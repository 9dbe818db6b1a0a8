"""The console on a real engine and admin service (memory stores) behind the real HTTP
endpoint: finding jobs, a job's page, acting only when signed in, escaping and the policy."""

from __future__ import annotations

import asyncio
import html
import logging
import re

import aiohttp
import pytest

from harness import wait_for_async
from harness.console_serving import PASSWORD, browser, console, csrf_of, sign_in
from hrwcron.console.html import CSP
from hrwcron.core.model import JobSpec

HOSTILE = '<script>document.title="pwned"</script><img src=x onerror=alert(1)>"\'&'
SPECS = [
    JobSpec(name="billing.sweep", schedule="0 * * * *", tags=["money"]),
    JobSpec(name="billing.invoice", schedule="30 2 * * *", paused=True),
    JobSpec(name="reports.daily", schedule="0 9 * * *", exclude=["* * * * 0,6"]),
    JobSpec(name="reports.billing-summary", schedule="@every 1h", description=HOSTILE),
    JobSpec(name="cleanup.tmp", schedule="*/5 * * * *", tags=["ops"]),
]


async def loaded(served: object, count: int) -> None:
    scheduler = served.scheduler  # type: ignore[attr-defined]
    await wait_for_async(lambda: len(scheduler.jobs) == count, message=f"{count} jobs loaded")


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, str, dict[str, str]]:
    async with session.get(url, allow_redirects=False) as response:
        return response.status, await response.text(), dict(response.headers)


def job_names(page: str) -> list[str]:
    return re.findall(r'<a class="job-link" href="[^"]*">([^<]*)</a>', page)


async def test_search_puts_prefix_matches_first_then_names_holding_the_text() -> None:
    async with console(SPECS) as served, browser() as session:
        await loaded(served, len(SPECS))
        status, page, headers = await get(session, f"{served.url}/jobs?q=BILL")
        assert status == 200 and headers["Content-Security-Policy"] == CSP
        assert job_names(page) == ["billing.invoice", "billing.sweep", "reports.billing-summary"]
        assert "<b>3</b> jobs match" in page
        status, part, _ = await get(session, f"{served.url}/jobs?q=sweep&part=results")
        assert part.startswith('<section id="results"') and job_names(part) == ["billing.sweep"]
        builds = served.console.lister.index.builds
        for typed in ("r", "re", "rep", "repo"):  # keystrokes: the index is not rebuilt
            await get(session, f"{served.url}/jobs?q={typed}&part=results")
        assert served.console.lister.index.builds == builds
        await served.jobs.put(JobSpec(name="reports.weekly", schedule="@weekly"), None)
        await loaded(served, len(SPECS) + 1)
        _, part, _ = await get(session, f"{served.url}/jobs?q=repo&part=results")
        assert "reports.weekly" in job_names(part)
        assert served.console.lister.index.builds == builds + 1


async def test_filters_by_state_tag_owner_and_missed_and_pages() -> None:
    async with console(SPECS) as served, browser() as session:
        await loaded(served, len(SPECS))
        base = f"{served.url}/jobs?part=results"
        assert job_names((await get(session, f"{base}&state=paused"))[1]) == ["billing.invoice"]
        assert job_names((await get(session, f"{base}&tag=ops"))[1]) == ["cleanup.tmp"]
        both = await get(session, f"{base}&q=billing&state=active")
        assert job_names(both[1]) == ["billing.sweep", "reports.billing-summary"]
        # With no live member yet (the memory engine's replica is the only one), owners are
        # whoever the ranking names; every job is owned by the one replica or by nobody.
        owned = job_names((await get(session, f"{base}&owner=c1"))[1])
        assert set(owned) <= {s.name for s in SPECS}
        assert job_names((await get(session, f"{base}&missed=1"))[1]) == []
        served.telemetry.tick_log.note(
            "cleanup.tmp", "missed", 1, None, served.scheduler.clock.now_ms()
        )
        assert job_names((await get(session, f"{base}&missed=1"))[1]) == ["cleanup.tmp"]
        first = await get(session, f"{base}&limit=2")
        second = await get(session, f"{base}&limit=2&start=2")
        assert len(job_names(first[1])) == 2 and len(job_names(second[1])) == 2
        assert not set(job_names(first[1])) & set(job_names(second[1]))
        assert 'id="next"' in first[1] and 'id="prev"' in second[1]


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("state=bogus", "state must be one of"),
        ("limit=0", "limit must be an integer up to 200"),
        ("start=-1", "start must be an integer"),
        ("q=" + "a" * 300, "q is longer than 200 characters"),
    ],
)
async def test_a_bad_list_query_is_refused_with_its_reason(query: str, message: str) -> None:
    async with console(SPECS[:1]) as served, browser() as session:
        status, body, _ = await get(session, f"{served.url}/jobs?{query}")
        assert status == 400 and message in body


async def test_a_job_page_explains_its_next_ticks_and_shows_its_spec_escaped() -> None:
    async with console(SPECS) as served, browser() as session:
        await loaded(served, len(SPECS))
        status, page, headers = await get(session, f"{served.url}/jobs/reports.daily")
        assert status == 200 and headers["Content-Security-Policy"] == CSP
        assert 'id="next"' in page and 'id="order"' in page and 'id="runs"' in page
        # Ten weekdays at 09:00 span a weekend: its ticks are one line, with the rule.
        assert "excluded by <code>* * * * 0,6</code>, and every tick before" in page
        assert page.count("<td>fires</td>") == 10
        assert "<b>c1</b>" in page  # the owner
        assert "read-only: sign in to pause" in page
        status, page, _ = await get(session, f"{served.url}/jobs/reports.billing-summary")
        assert status == 200
        assert HOSTILE not in page and "<img src=x" not in page
        assert "&lt;script&gt;document.title=&quot;pwned&quot;&lt;/script&gt;" in page
        assert page.count("<script") == 1 and 'src="/static/console.js' in page
        assert " style=" not in page and "<style" not in page
        assert (await get(session, f"{served.url}/jobs/no.such.job"))[0] == 404
        status, body, _ = await get(session, f"{served.url}/jobs/bad%20name")
        assert status == 400 and "bad token" in body


async def test_acting_needs_a_signed_in_user_and_a_csrf_token(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hrwcron.audit")
    async with console(SPECS) as served, browser() as session:
        await loaded(served, len(SPECS))
        url = f"{served.url}/jobs/billing.sweep"
        async with session.post(f"{url}/pause", data={"csrf": "x"}) as response:
            assert (
                response.status == 403 and "read-only without signing in" in await response.text()
            )
        assert not (await served.jobs.get("billing.sweep")).spec.paused  # type: ignore[union-attr]
        assert "audit: refused pause billing.sweep" in caplog.text
        assert await sign_in(session, served.url, "wrong password") == 200
        assert "unknown user or wrong password" in caplog.text
        assert await sign_in(session, served.url) == 200
        _, page, _ = await get(session, url)
        assert "signed in as <b>alice</b>" in page
        async with session.post(f"{url}/pause", data={"csrf": "forged"}) as response:
            assert response.status == 403
        async with session.post(
            f"{url}/pause", data={"csrf": csrf_of(page)}, headers={"Origin": "http://evil.example"}
        ) as response:
            assert response.status == 403  # right token, another site's form
        cross = {"Sec-Fetch-Site": "cross-site", "Origin": served.url}
        async with session.post(f"{url}/pause", data={"csrf": csrf_of(page)}, headers=cross) as r:
            assert r.status == 403  # what a browser says wins over a copied Origin
        assert not (await served.jobs.get("billing.sweep")).spec.paused  # type: ignore[union-attr]
        async with session.post(f"{url}/pause", data={"csrf": csrf_of(page)}) as response:
            assert response.status == 200 and "paused (revision" in await response.text()
        assert (await served.jobs.get("billing.sweep")).spec.paused  # type: ignore[union-attr]
        assert "audit: alice jobs.pause billing.sweep" in caplog.text
        async with session.post(f"{url}/resume", data={"csrf": csrf_of(page)}) as response:
            assert response.status == 200
        assert not (await served.jobs.get("billing.sweep")).spec.paused  # type: ignore[union-attr]
    assert PASSWORD not in caplog.text and "scrypt$" not in caplog.text


async def test_trigger_backfill_with_a_dry_run_first_delete_and_bulk() -> None:
    async with console(SPECS) as served, browser() as session:
        await loaded(served, len(SPECS))
        await sign_in(session, served.url)
        url = f"{served.url}/jobs/billing.sweep"
        _, page, _ = await get(session, url)
        token = csrf_of(page)
        async with session.post(f"{url}/trigger", data={"csrf": token, "id": "by-hand-1"}) as r:
            page = await r.text()
            assert r.status == 200 and "billing.sweep:manual:by-hand-1" in page
        assert "billing.sweep:manual:by-hand-1</td>" in page  # in the runs, from the stream
        async with session.post(f"{url}/trigger", data={"csrf": token, "id": "no spaces"}) as r:
            assert r.status == 400 and "is not a valid trigger id" in await r.text()
        window = {"csrf": token, "from": "2026-01-01T00:00:00Z", "to": "2026-01-01T02:00:00Z"}
        async with session.post(f"{url}/backfill", data=window) as r:
            page = await r.text()
            assert r.status == 200 and "Dry run: would publish 3" in page
        assert len(await served.triggers.history("hrwcron.trigger.billing.sweep", 100)) == 1
        async with session.post(f"{url}/backfill", data={**window, "step": "publish"}) as r:
            assert r.status == 200 and "Published 3" in await r.text()
        assert len(await served.triggers.history("hrwcron.trigger.billing.sweep", 100)) == 4
        async with session.post(f"{url}/backfill", data={**window, "to": "nonsense"}) as r:
            assert r.status == 400 and "to" in await r.text()
        async with session.post(f"{url}/delete", data={"csrf": token, "confirm": "nope"}) as r:
            assert r.status == 400 and "nothing was deleted" in await r.text()
        assert await served.jobs.get("billing.sweep") is not None
        async with session.post(
            f"{url}/delete", data={"csrf": token, "confirm": "billing.sweep"}
        ) as r:
            assert r.status == 200
        assert await served.jobs.get("billing.sweep") is None
        bulk = [
            ("csrf", token),
            ("action", "pause"),
            ("name", "cleanup.tmp"),
            ("name", "reports.daily"),
        ]
        async with session.post(f"{served.url}/jobs/bulk", data=bulk) as r:
            page = await r.text()
            assert r.status == 200 and page.count(">paused</span>") == 2
        for name in ("cleanup.tmp", "reports.daily"):
            assert (await served.jobs.get(name)).spec.paused  # type: ignore[union-attr]


async def test_a_status_token_guards_reading_and_a_trusted_proxy_names_the_user() -> None:
    token = "status-token-0123456789"
    async with (
        console(
            SPECS[:1],
            status_token=token,
            trusted_header="X-Forwarded-User",
            trusted_proxies=["127.0.0.1"],
        ) as served,
        browser() as session,
    ):
        for path in ("/", "/jobs", "/jobs/billing.sweep", "/events"):
            assert (await get(session, served.url + path))[0] == 401, path
        basic = {"Authorization": aiohttp.encode_basic_auth("anyone", token)}
        async with session.get(f"{served.url}/jobs", headers=basic) as response:
            assert response.status == 200 and "read-only" in await response.text()
        async with session.get(
            f"{served.url}/jobs", headers={"X-Forwarded-User": "bob"}
        ) as response:
            assert response.status == 200 and "signed in as <b>bob</b>" in await response.text()
        assert (await get(session, served.url + "/healthz"))[0] == 200


async def test_a_header_from_an_untrusted_address_names_nobody() -> None:
    async with (
        console(
            SPECS[:1], trusted_header="X-Forwarded-User", trusted_proxies=["10.1.2.3"]
        ) as served,
        browser() as session,
    ):
        async with session.get(
            f"{served.url}/jobs", headers={"X-Forwarded-User": "mallory"}
        ) as response:
            page = await response.text()
        assert "mallory" not in page and "read-only" in page


async def test_the_fleet_page_and_its_live_pulses() -> None:
    async with console(SPECS) as served, browser() as session:
        await loaded(served, len(SPECS))
        status, page, headers = await get(session, served.url + "/")
        assert status == 200 and headers["Content-Security-Policy"] == CSP
        assert 'id="members"' in page and 'data-live="fleet"' in page
        # The first view does not wait for the walk over every job; the next one shows it.
        assert 'id="timeline-pending"' in page
        await wait_for_async(lambda: served.console.fleet.walks == 1, message="a walk done")
        _, page, _ = await get(session, served.url + "/")
        assert 'id="timeline"' in page and "timeline-pending" not in page
        status, part, _ = await get(session, served.url + "/?part=fleet")
        assert part.startswith('<section id="fleet">')
        async with session.get(f"{served.url}/events?job=billing.sweep") as response:
            assert response.headers["Content-Type"] == "text/event-stream"
            line = await asyncio.wait_for(response.content.readline(), 10)
        assert line.startswith(b"data: {") and b'"jobs":' in line and b'"job":' in line
        await wait_for_async(lambda: served.console.pulses.open == 0, message="stream closed")


async def test_static_files_come_from_the_package() -> None:
    async with console() as served, browser() as session:
        status, script, headers = await get(session, served.url + "/static/console.js")
        assert status == 200 and headers["Content-Type"].startswith("text/javascript")
        assert "trustedTypes" in script and "EventSource" in script
        status, _, headers = await get(session, served.url + "/static/console.css")
        assert status == 200 and headers["Content-Type"].startswith("text/css")
        assert (await get(session, served.url + "/static/nope.js"))[0] == 404


async def test_a_form_posted_through_a_tls_proxy_counts_as_this_site() -> None:
    async with console(SPECS[:1]) as served, browser() as session:
        await loaded(served, 1)
        await sign_in(session, served.url)
        url = f"{served.url}/jobs/billing.sweep"
        _, page, _ = await get(session, url)
        host = served.url.removeprefix("http://")
        # The page was https at the proxy; the host is the same, so it is this site's form.
        async with session.post(
            f"{url}/pause", data={"csrf": csrf_of(page)}, headers={"Origin": f"https://{host}"}
        ) as response:
            assert response.status == 200
        assert (await served.jobs.get("billing.sweep")).spec.paused  # type: ignore[union-attr]


async def test_names_that_could_forge_an_audit_line_sign_in_nobody(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="hrwcron.audit")
    async with (
        console(
            SPECS[:1], trusted_header="X-Forwarded-User", trusted_proxies=["127.0.0.1"]
        ) as served,
        browser() as session,
    ):
        async with session.get(
            f"{served.url}/jobs", headers={"X-Forwarded-User": "bob audit: root deleted"}
        ) as response:
            assert "read-only" in await response.text()
        async with session.post(
            f"{served.url}/login",
            data={"name": "eve\naudit: admin signed in", "password": "x", "next": "/"},
        ) as response:
            assert "unknown user or wrong password" in await response.text()
    assert "eve" not in caplog.text and "(not a user name)" in caplog.text


def test_the_tick_log_keeps_a_bounded_recent_past() -> None:
    from hrwcron.adapters.tick_log import HOUR_MS, MAX_JOBS, PER_JOB, TickLog

    log = TickLog()
    now = 10 * HOUR_MS
    for i in range(PER_JOB + 5):
        log.note("a", "missed", i, None, now + i)
    log.note("a", "started", 1, 1500.0, now)
    log.note("a", "started", 2, 20.0, now)
    assert len(log.troubles("a")) == PER_JOB and log.troubles("a")[0].due_ms == PER_JOB + 4
    assert log.missed_since(now) == {"a"} and log.missed_since(now + HOUR_MS) == set()
    (minute,) = log.minutes(now)
    assert (minute.published, minute.late, minute.missed) == (2, 1, PER_JOB + 5)
    for i in range(MAX_JOBS + 10):
        log.note(f"j{i}", "fenced", 1, None, now)
    assert not log.troubles("a") and log.troubles(f"j{MAX_JOBS + 9}")
    assert log.minutes(now + 2 * HOUR_MS) == []


async def test_what_members_announce_is_escaped_on_the_fleet_page() -> None:
    from hrwcron.core.model import Heartbeat

    async with console(SPECS[:1]) as served, browser() as session:
        hostile = Heartbeat(
            node="evil",
            instance="i",
            started_ms=1,
            version=HOSTILE,
            digest=HOSTILE,
            ready=False,
            reason=HOSTILE,
            tags=[HOSTILE],
        )
        await served.members.register("evil", hostile, 0.0)
        await wait_for_async(
            lambda: "evil" in served.scheduler.view.heartbeats(), message="evil in view"
        )
        served.console.fleet._fleet = None  # not the copy from before it joined
        await get(session, served.url + "/")
        await wait_for_async(lambda: served.console.fleet.walks == 1, message="a walk done")
        status, page, _ = await get(session, served.url + "/")
        assert status == 200 and "evil" in page
        assert HOSTILE not in page and "<img src=x" not in page
        assert page.count("&lt;script&gt;document.title=&quot;pwned&quot;") >= 4
        assert page.count("<script") == 1


async def test_a_link_cannot_make_a_job_page_announce_anything() -> None:
    async with console(SPECS[:1]) as served, browser() as session:
        await loaded(served, 1)
        url = f"{served.url}/jobs/billing.sweep"
        _, page, _ = await get(session, f"{url}?done=paused+(revision+3)")
        assert '<p id="done" class="ok">paused (revision 3)</p>' in page
        _, page, _ = await get(session, f"{url}?done=job+deleted+by+admin")
        assert 'id="done"' not in page and "deleted by admin" not in page


async def test_the_timeline_counts_the_next_hour_and_names_the_heaviest_second() -> None:
    specs = [
        JobSpec(name="t.five", schedule="*/5 * * * *"),
        JobSpec(name="t.hourly", schedule="0 * * * *"),
        JobSpec(name="t.every", schedule="@every 1h"),
        JobSpec(name="t.gpu", schedule="* * * * *", tags=["gpu"]),  # nobody is eligible
    ]
    async with console(specs) as served:
        await loaded(served, len(specs))
        await wait_for_async(lambda: served.telemetry.live == ["c1"], message="c1 live")
        timeline = await served.console.fleet.timeline()
        (counts,) = timeline.per_member.values()
        assert len(counts) == 61
        # */5 fires 12 or 13 times in 61 minutes, the two hourly ones once each.
        assert 14 <= timeline.ticks <= 15, timeline
        second, ticks = timeline.heaviest[0]
        assert second % 3_600_000 == 0 and ticks == 3  # the top of the hour: a herd of three
        walk = served.console.fleet._walk
        await served.console.fleet.timeline()
        assert served.console.fleet._walk is walk  # one walk over the jobs, kept


async def test_an_open_event_stream_does_not_hold_up_the_replica_stopping() -> None:
    async with (
        console(SPECS[:1]) as served,
        browser() as session,
        session.get(f"{served.url}/events") as response,
    ):
        assert (await asyncio.wait_for(response.content.readline(), 10)).startswith(b"data:")
        assert served.console.pulses.open == 1
        loop = asyncio.get_running_loop()
        began = loop.time()
        await served.http.close()
        assert loop.time() - began < 0.5  # a replica's stop gives the endpoint 0.5 s
        assert served.console.pulses.open == 0


FLEET = [JobSpec(name=f"fleet.job-{i:02d}", schedule="@hourly") for i in range(60)]


async def test_pause_and_resume_every_job_a_search_finds_after_confirming_its_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    caplog.set_level(logging.INFO, logger="hrwcron.audit")
    async with console([*SPECS, *FLEET]) as served, browser() as session:
        await loaded(served, len(SPECS) + len(FLEET))
        await sign_in(session, served.url)
        # A page of 10 offers all 60 matches, whatever the page.
        _, page, _ = await get(session, f"{served.url}/jobs?q=FLEET.&limit=10&start=20")
        assert len(job_names(page)) == 10 and "with all 60 matching jobs (every page)" in page
        assert '<input type="hidden" name="q" value="FLEET.">' in page
        token = csrf_of(page)
        ask = {"csrf": token, "q": "FLEET.", "action": "pause"}

        def paused() -> list[str]:
            return sorted(n for n, job in served.scheduler.jobs.items() if job.spec.paused)

        async def post(data: dict[str, str]) -> tuple[int, str]:
            async with session.post(f"{served.url}/jobs/bulk-all", data=data) as r:
                return r.status, html.unescape(await r.text())

        status, page = await post(ask)  # first, the confirmation naming the count
        assert status == 200 and 'id="confirm-count">Pause <b>60</b> jobs' in page
        assert "q='FLEET.'" in page and 'name="confirm" value="60"' in page
        assert paused() == ["billing.invoice"]
        status, page = await post({**ask, "confirm": "59"})  # the matches changed since
        assert status == 200 and "59 then, 60 now. Nothing was changed yet." in page
        assert paused() == ["billing.invoice"]
        status, page = await post({**ask, "confirm": "60"})
        assert status == 200 and "60 changed, 0 unchanged, 0 refused" in page
        every = sorted(spec.name for spec in FLEET)
        await wait_for_async(lambda: paused() == sorted([*every, "billing.invoice"]))
        assert "audit: alice jobs.pause all 60 matching q='FLEET.' from" in caplog.text
        assert "60 changed, 0 refused" in caplog.text
        assert caplog.text.count("audit: alice jobs.pause fleet.job-") == 60  # one line each

        # With a filter: the paused ones whose names hold "job-0" (one was resumed elsewhere).
        await served.jobs.put(JobSpec(name="fleet.job-05", schedule="@hourly"), None)
        await wait_for_async(lambda: "fleet.job-05" not in paused())
        resume = {"csrf": token, "q": "job-0", "state": "paused", "action": "resume"}
        status, page = await post(resume)
        assert 'id="confirm-count">Resume <b>9</b> jobs' in page
        status, page = await post({**resume, "confirm": "9"})
        assert status == 200 and "9 changed, 0 unchanged" in page
        left = [n for n in every if not n.startswith("fleet.job-0")]
        await wait_for_async(lambda: paused() == sorted([*left, "billing.invoice"]))

        # Past the bound nothing is done, and the list says so instead of offering it.
        monkeypatch.setattr("hrwcron.console.actions.MAX_ALL", 20)
        monkeypatch.setattr("hrwcron.console.jobs_page.MAX_ALL", 20)
        status, page = await post({**ask, "confirm": "60"})
        assert status == 400 and "60 jobs match q='FLEET.': one action takes at most 20" in page
        _, page, _ = await get(session, f"{served.url}/jobs?q=FLEET.")
        assert "takes at most 20 at once; narrow the search" in page
        assert 'action="/jobs/bulk-all"' not in page

        # Bad input gets its reason, and changes nothing.
        for bad, reason in (
            ({"action": "delete"}, "choose pause or resume"),
            ({"state": "sleepy"}, "state must be one of"),
            ({"q": "no.such.job"}, "no job matches"),
        ):
            status, page = await post({**ask, **bad, "confirm": "1"})
            assert status == 400 and reason in page, bad
        assert len(paused()) == len(left) + 1
        session.cookie_jar.clear()  # signed out: refused, as every action is
        async with session.post(f"{served.url}/jobs/bulk-all", data={**ask, "confirm": "60"}) as r:
            assert r.status == 403
        assert len(paused()) == len(left) + 1


async def test_the_replica_times_each_build_of_the_index_in_its_metrics() -> None:
    async with console(SPECS) as served, browser() as session:
        await loaded(served, len(SPECS))
        # The owner facet follows the live members: once the replica counts itself live.
        await wait_for_async(lambda: served.telemetry.live == ["c1"], message="c1 live")
        await get(session, f"{served.url}/jobs?state=paused")
        _, metrics, _ = await get(session, f"{served.url}/metrics")
        for build in ("names", "facets"):
            for name in ("longest_turn_seconds", "build_seconds"):
                assert f'hrwcron_console_index_{name}{{build="{build}"}}' in metrics
        await served.jobs.put(
            JobSpec(name="billing.sweep", schedule="@daily", tags=["money"]), None
        )
        await wait_for_async(
            lambda: served.scheduler.jobs["billing.sweep"].spec.schedule == "@daily"
        )
        _, page, _ = await get(session, f"{served.url}/jobs?tag=money")
        assert job_names(page) == ["billing.sweep"]
        _, metrics, _ = await get(session, f"{served.url}/metrics")
        assert 'build="names checked"' in metrics and 'build="facets updated"' in metrics
        index = served.console.lister.index
        assert (index.builds, index.facet_builds, index.facet_updates) == (1, 1, 1)
