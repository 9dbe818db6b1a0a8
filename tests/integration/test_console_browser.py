"""The console in a real browser: headless Chromium driven by Selenium (Debian's chromium and
chromium-driver, from make system-deps) against two replicas on a real nats-server.

A person searches, opens a job, is refused an action without signing in, signs in, pauses and
resumes it, triggers it and sees the run appear; changes made elsewhere (through the admin API,
as the CLI makes them) show on the open page without reloading. Screenshots of the main pages
go to the test's directory, and to ``HRWCRON_SCREENSHOTS`` when that names one (``docs``, for
the console's page, docs/console.md).

Selenium's calls block, and the replicas run on this test's event loop, so every browser step
runs in a thread.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec
import pytest

from harness import NatsServer, wait_for_async
from harness.timings import QUICK
from hrwcron.admin import AdminClient
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.core.model import JobSpec
from hrwcron.core.passwords import hash_password
from hrwcron.process.app import Replica, start_replica

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is a dev dependency")
from selenium.common.exceptions import WebDriverException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
DRIVER = "/usr/bin/chromedriver"
PASSWORD = "e2e-password-0123"
USERS = [f"operator:{hash_password(PASSWORD)}"]
WAIT_S = 30.0
T = TypeVar("T")

JOBS = [
    JobSpec(
        name="billing.sweep",
        schedule="*/2 * * * * *",
        description="sweeps unpaid invoices",
        tags=[],
        payload={"batch": 500},
    ),
    JobSpec(name="billing.invoices", schedule="0 2 * * *", tz="Europe/Berlin", jitter=30),
    JobSpec(name="reports.daily", schedule="0 9 * * *", exclude=["* * * * 0,6"]),
    JobSpec(name="reports.weekly", schedule="H H * * 1", description="hashed time, Mondays"),
    JobSpec(name="cleanup.tmp", schedule="@every 30s", paused=True),
    *[JobSpec(name=f"fleet.task-{i:03d}", schedule="@hourly", jitter=3600) for i in range(120)],
]


def config(url: str, node: str) -> Config:
    return Config(
        nats=NatsConfig(servers=[url]),
        scheduler=SchedulerConfig(node_id=node, **QUICK.settings()),
        http=HttpConfig(listen="127.0.0.1:0", users=USERS),
        jobs=JOBS,
    )


@pytest.fixture
def chrome(tmp_path: Path) -> Iterator[Any]:
    if not (os.access(CHROMIUM, os.X_OK) and os.access(DRIVER, os.X_OK)):
        pytest.skip(
            f"{CHROMIUM} or {DRIVER} not found: install Debian's chromium and chromium-driver "
            "(make system-deps)"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run"):
        options.add_argument(flag)
    options.add_argument("--window-size=1400,1000")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # to check for errors
    options.add_argument(f"--user-data-dir={tmp_path / 'profile'}")
    service = webdriver.ChromeService(
        executable_path=DRIVER, log_output=str(tmp_path / "driver.log")
    )
    try:
        driver = webdriver.Chrome(options=options, service=service)
    except WebDriverException as exc:
        pytest.skip(f"chromium could not be started through chromedriver: {exc.msg}")
    driver.set_page_load_timeout(WAIT_S)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
async def replicas(nats_server: NatsServer) -> AsyncIterator[list[Replica]]:
    started: list[Replica] = []
    try:
        for node in ("web-a", "web-b"):
            started.append(await start_replica(config(nats_server.url, node), {}))
        yield started
    finally:
        for replica in started:
            await replica.stop()


async def step(action: Callable[[], T]) -> T:
    return await asyncio.to_thread(action)


def until(driver: Any, condition: Callable[[Any], Any], what: str) -> Any:
    return WebDriverWait(driver, WAIT_S, poll_frequency=0.1).until(condition, message=what)


def text_of(driver: Any, css: str) -> str:
    """The element's text, read in the page at once: live parts replace their elements."""
    text: str = driver.execute_script(
        "const found = document.querySelector(arguments[0]);return found ? found.innerText : '';",
        css,
    )
    return text


def shoot(driver: Any, where: Path, name: str) -> Path:
    path = where / f"console-{name}.png"
    driver.save_screenshot(str(path))
    assert path.stat().st_size > 10_000  # a page was drawn, not a blank
    published = os.environ.get("HRWCRON_SCREENSHOTS")
    if published:
        shutil.copy(path, Path(published) / path.name)
    return path


async def test_search_open_act_and_see_changes_live(
    replicas: list[Replica], chrome: Any, nats_server: NatsServer, tmp_path: Path
) -> None:
    first = replicas[0]
    assert first.http is not None
    base = first.http.url

    def formed() -> bool:
        return all(len(r.scheduler.jobs) == len(JOBS) for r in replicas) and all(
            sorted(r.scheduler.ranking_of("x")) == ["web-a", "web-b"] for r in replicas
        )

    await wait_for_async(formed, timeout=60, message="both replicas ready with every job")
    admin = AdminClient(first.stores.client, timeout=10)

    async def fired() -> bool:
        return bool((await admin.history("billing.sweep", limit=1)).triggers)

    await wait_for_async(fired, timeout=60, message="billing.sweep has fired")

    # The fleet, then type-ahead: the results change as one types, the page is not reloaded.
    def fleet() -> None:
        chrome.get(base + "/")
        until(chrome, lambda d: "web-b" in text_of(d, "#members"), "both members listed")
        until(chrome, lambda d: text_of(d, "#live-state") == "live", "the page is live")
        # Counted in the background after the first view; the page shows it when it is done.
        until(chrome, lambda d: text_of(d, "#heaviest"), "the timeline, without reloading")
        shoot(chrome, tmp_path, "fleet")

    await step(fleet)

    def search() -> None:
        chrome.get(base + "/jobs")
        chrome.execute_script("window.sameDocument = true")
        box = chrome.find_element(By.ID, "q")
        box.send_keys("bill")
        until(
            chrome,
            lambda d: text_of(d, "#count").startswith("2 jobs match"),
            "two jobs match 'bill'",
        )
        names = chrome.execute_script(
            "return [...document.querySelectorAll('a.job-link')].map(a => a.textContent)"
        )
        assert names == ["billing.invoices", "billing.sweep"]
        box.send_keys("x")  # still typing: nothing matches
        until(chrome, lambda d: text_of(d, "#count").startswith("0 jobs match"), "no match")
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys("sweep")
        until(chrome, lambda d: text_of(d, "#count").startswith("1 job match"), "one match")
        assert chrome.execute_script("return window.sameDocument") is True
        assert "q=sweep" in chrome.current_url  # the address follows, so it can be shared
        chrome.execute_script("document.querySelector('a.job-link').click()")
        until(chrome, lambda d: text_of(d, "#job-name") == "billing.sweep", "the job's page")
        assert "read-only" in text_of(chrome, "#actions")

    await step(search)

    # Without signing in, an action is refused and changes nothing.
    def refused() -> int:
        status: int = chrome.execute_async_script(
            "const done = arguments[0];"
            "const form = new URLSearchParams({csrf: 'x'});"
            "fetch('/jobs/billing.sweep/pause', {method: 'POST', body: form})"
            ".then(r => done(r.status));"
        )
        return status

    assert await step(refused) == 403
    entry = await admin.get_job("billing.sweep")
    assert entry.spec is not None and not entry.spec.paused

    # Sign in, pause and resume from the page, and see the change.
    def sign_in_and_pause() -> None:
        chrome.get(base + "/login?next=/jobs/billing.sweep")
        chrome.find_element(By.NAME, "name").send_keys("operator")
        chrome.find_element(By.NAME, "password").send_keys(PASSWORD)
        chrome.find_element(By.CSS_SELECTOR, "#login button").click()
        until(chrome, lambda d: "operator" in text_of(d, "#user"), "signed in")
        chrome.find_element(By.XPATH, "//form[contains(@action,'/pause')]//button").click()
        until(chrome, lambda d: text_of(d, "#state") == "paused", "the job shows paused")
        assert "paused (revision" in text_of(chrome, "#done")

    await step(sign_in_and_pause)
    entry = await admin.get_job("billing.sweep")
    assert entry.spec is not None and entry.spec.paused

    def resume_live() -> None:
        chrome.execute_script("window.sameDocument = true")

    await step(resume_live)
    await admin.pause("billing.sweep", False)  # elsewhere, as the CLI would: the page follows
    await step(lambda: until(chrome, lambda d: text_of(d, "#state") == "active", "resumed, live"))
    assert await step(lambda: chrome.execute_script("return window.sameDocument")) is True

    # Trigger with an id and see the run appear; then one triggered elsewhere, live.
    def trigger() -> None:
        chrome.find_element(By.NAME, "id").send_keys("from-the-console")
        chrome.find_element(By.XPATH, "//form[contains(@action,'/trigger')]//button").click()
        until(
            chrome,
            lambda d: "billing.sweep:manual:from-the-console" in text_of(d, "#runs"),
            "the manual run in the history",
        )
        chrome.execute_script("window.sameDocument = true")

    await step(trigger)
    await admin.trigger("billing.sweep", "from-the-cli")
    await step(
        lambda: until(
            chrome,
            lambda d: "billing.sweep:manual:from-the-cli" in text_of(d, "#runs"),
            "a run triggered elsewhere appears without reloading",
        )
    )
    assert await step(lambda: chrome.execute_script("return window.sameDocument")) is True
    console_errors = [
        entry
        for entry in await step(lambda: chrome.get_log("browser"))
        if entry.get("level") == "SEVERE" and "status of 403" not in entry.get("message", "")
    ]
    assert not console_errors, msgspec.json.encode(console_errors).decode()[:2000]

    # The pages as docs/console.md shows them: the list as a signed-in user sees it, and a job
    # whose next ticks need explaining (weekends excluded), with a run of its own.
    await admin.trigger("reports.daily", "rerun-1")

    def pictures() -> None:
        chrome.set_window_size(1400, 1500)
        chrome.get(base + "/jobs")
        until(chrome, lambda d: "billing.sweep" in text_of(d, "#jobs"), "the job list")
        shoot(chrome, tmp_path, "jobs")
        chrome.get(base + "/jobs/reports.daily")
        until(chrome, lambda d: "rerun-1" in text_of(d, "#runs"), "the run of reports.daily")
        assert "excluded by" in text_of(chrome, "#next")
        shoot(chrome, tmp_path, "job")

    await step(pictures)

    # Every job a search finds, on every page of the list: asked again with the count, then
    # paused through the admin handlers, on both replicas.
    def pause_all_matching() -> None:
        chrome.get(base + "/jobs?q=fleet.task")
        until(chrome, lambda d: text_of(d, "#count").startswith("120 jobs match"), "120 tasks")
        assert len(chrome.find_elements(By.CSS_SELECTOR, "a.job-link")) == 50  # one page
        chrome.find_element(
            By.XPATH, "//form[@action='/jobs/bulk-all']//button[@value='pause']"
        ).click()
        until(
            chrome,
            lambda d: text_of(d, "#confirm-count").startswith("Pause 120 jobs"),
            "a confirmation naming the count",
        )
        chrome.find_element(By.CSS_SELECTOR, "form.confirm-all button").click()
        until(
            chrome,
            lambda d: text_of(d, "#bulk-counts").startswith("120 changed"),
            "all 120 paused",
        )

    await step(pause_all_matching)
    tasks = [f"fleet.task-{i:03d}" for i in range(120)]
    await wait_for_async(
        lambda: all(r.scheduler.jobs[n].spec.paused for r in replicas for n in tasks),
        timeout=30,
        message="every task paused on both replicas",
    )
    assert not replicas[0].scheduler.jobs["billing.sweep"].spec.paused  # no other job
