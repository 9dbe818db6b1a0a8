"""A console over a real engine and admin service on the in-memory stores, served by the real
HTTP endpoint on a loopback port: for the console's unit tests, no NATS server."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import aiohttp
from yarl import URL

from hrwcron.adapters.http import HttpServer
from hrwcron.adapters.memory import MemoryClaims, MemoryJobs, MemoryMembers, MemoryTriggers
from hrwcron.adapters.telemetry import Telemetry
from hrwcron.admin.service import AdminService
from hrwcron.admin.status import ReplicaStatus
from hrwcron.console import Auth, Console
from hrwcron.console.auth import parse_users
from hrwcron.core.model import JobSpec
from hrwcron.core.passwords import hash_password
from hrwcron.engine.scheduler import Scheduler, Settings

from .serving import FakeClient

SETTINGS = Settings(node_id="c1", heartbeat_interval=0.2, member_ttl=1.0, shutdown_timeout=1.0)
PASSWORD = "correct horse battery"
# Hashing costs tens of milliseconds: once for the whole module.
USERS = [f"alice:{hash_password(PASSWORD)}"]


@dataclass
class Served:
    console: Console
    scheduler: Scheduler
    jobs: MemoryJobs
    triggers: MemoryTriggers
    telemetry: Telemetry
    http: HttpServer
    members: MemoryMembers

    @property
    def url(self) -> str:
        return self.http.url


@contextlib.asynccontextmanager
async def console(
    specs: Sequence[JobSpec] = (),
    *,
    status_token: str | None = None,
    users: Sequence[str] = USERS,
    trusted_header: str = "",
    trusted_proxies: Sequence[str] = (),
) -> AsyncIterator[Served]:
    jobs = MemoryJobs()
    for spec in specs:
        await jobs.put(spec, None)
    triggers = MemoryTriggers()
    members = MemoryMembers(SETTINGS.member_ttl)
    telemetry = Telemetry(node=SETTINGS.node_id, process_metrics=False)
    scheduler = Scheduler(
        SETTINGS,
        members=members,
        claims=MemoryClaims(),
        triggers=triggers,
        jobs=jobs,
        observer=telemetry,
    )
    await scheduler.start()
    admin = AdminService(
        FakeClient(1024 * 1024),  # type: ignore[arg-type]
        scheduler,
        jobs,
        triggers,
        duplicate_window=600.0,
    )
    status = ReplicaStatus(scheduler, telemetry)
    auth = Auth(
        users=parse_users(users),
        status_token=status_token,
        trusted_header=trusted_header,
        trusted_proxies=trusted_proxies,
    )
    the_console = Console(scheduler, status, telemetry, admin, auth)
    http = HttpServer(
        "127.0.0.1:0",
        registry=telemetry.registry,
        source=status,
        status_token=status_token,
        mounts=[the_console.mount],
    )
    await http.start()
    try:
        yield Served(the_console, scheduler, jobs, triggers, telemetry, http, members)
    finally:
        await http.close()
        await scheduler.stop()


def browser() -> aiohttp.ClientSession:
    """A client that keeps cookies for a loopback address, as a browser does."""
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def sign_in(session: aiohttp.ClientSession, base: str, password: str = PASSWORD) -> int:
    async with session.post(
        f"{base}/login", data={"name": "alice", "password": password, "next": "/jobs"}
    ) as response:
        await response.read()
        return response.status


def csrf_of(page: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found, "no CSRF token in the page"
    return found.group(1)


def session_cookie(session: aiohttp.ClientSession, base: str) -> str:
    cookies = session.cookie_jar.filter_cookies(URL(base))
    return cookies["hrwcron_session"].value if "hrwcron_session" in cookies else ""
