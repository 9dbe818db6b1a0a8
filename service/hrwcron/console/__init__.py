"""The console: the pages a person keeps open on a replica's HTTP endpoint.

``/`` the fleet, ``/jobs`` the job list with type-ahead search, filters and bulk pause and
resume, ``/jobs/<name>`` a job's page, its actions (``actions.py``), sign-in (``auth.py``),
``/events`` the pulses that keep open pages live (``events.py``) and ``/static/`` the one
script and style sheet, shipped in the package. Reading is open unless ``http.status_token``
is set; acting needs a signed-in user.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from importlib import resources
from urllib.parse import urlsplit

import msgspec
from aiohttp import web

from hrwcron.adapters.http import BadRequest, page_headers
from hrwcron.adapters.telemetry import Telemetry
from hrwcron.admin.replies import ApiError
from hrwcron.admin.service import AdminService
from hrwcron.admin.status import ReplicaStatus
from hrwcron.console import fleet_page, job_page, jobs_page
from hrwcron.console.actions import Actions
from hrwcron.console.auth import COOKIE, SESSION_S, USER_NAME, Auth, SignInRefused, same_origin
from hrwcron.console.events import Pulses
from hrwcron.console.fleet import FleetView
from hrwcron.console.html import CSP, Viewer, button, e, layout, message_page
from hrwcron.console.jobview import JobViews
from hrwcron.console.listing import Lister, ListQuery, ListResult
from hrwcron.core.model import job_name_problem
from hrwcron.engine.queries import EngineQueries

__all__ = ["Auth", "Console"]

_TYPES = {".js": "text/javascript", ".css": "text/css", ".svg": "image/svg+xml"}
_DONE = re.compile(r"(?:paused|resumed) \(revision \d+\)|no change|triggered [\w.:-]+: \w+")


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(
        text=text,
        status=status,
        content_type="text/html",
        charset="utf-8",
        headers=page_headers(CSP),
    )


def _static_files() -> dict[str, tuple[bytes, str, str]]:
    """name -> (body, content type, ETag), read once from the package."""
    found = {}
    for entry in resources.files("hrwcron.console").joinpath("static").iterdir():
        suffix = entry.name[entry.name.rfind(".") :]
        if suffix in _TYPES:
            body = entry.read_bytes()
            tag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
            found[entry.name] = (body, _TYPES[suffix], tag)
    return found


def safe_next(target: str) -> str:
    """Where to go after signing in: a path on this site, never another site."""
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return "/"
    return target


class Console:
    def __init__(
        self,
        scheduler: EngineQueries,
        status: ReplicaStatus,
        telemetry: Telemetry,
        admin: AdminService,
        auth: Auth,
    ) -> None:
        self._s = scheduler
        self._telemetry = telemetry
        self._admin = admin
        self.auth = auth
        self.lister = Lister(scheduler, status, telemetry)
        self.fleet = FleetView(scheduler, status, telemetry)
        self.jobs = JobViews(scheduler, status, telemetry, admin)
        self.actions = Actions(admin, auth, scheduler.node, self.lister.matching)
        self.pulses = Pulses(
            scheduler, telemetry, may_read=auth.may_read, walks=lambda: self.fleet.walks
        )
        self._static: dict[str, tuple[bytes, str, str]] | None = None

    def close(self) -> None:
        """Undo what building the console registered (see Lister.close)."""
        self.lister.close()

    def mount(self, app: web.Application) -> None:
        self._static = _static_files()
        app.router.add_get("/", self._fleet)
        app.router.add_get("/jobs", self._jobs)
        app.router.add_get("/jobs/{name}", self._job)
        self.actions.routes(app)
        app.router.add_get("/events", self.pulses.stream)
        app.router.add_get("/login", self._login_form)
        app.router.add_post("/login", self._login)
        app.router.add_post("/logout", self._logout)
        app.router.add_get("/static/{file}", self._file)
        app.on_shutdown.append(self.pulses.close)
        app.on_shutdown.append(self.fleet.close)

    # ------------------------------------------------------------------------- plumbing

    def _viewer(self, request: web.Request) -> Viewer:
        user = self.auth.user(request)
        if user is None:
            return Viewer(self._s.node)
        return Viewer(self._s.node, user.name, user.csrf)

    def _refuse(self) -> web.Response:
        response = web.Response(
            status=401,
            text="this console needs http.status_token (as the password of HTTP Basic) or a "
            "signed-in user: sign in at /login\n",
            content_type="text/plain",
        )
        response.headers["WWW-Authenticate"] = 'Basic realm="hrwcron status", charset="UTF-8"'
        return response

    def _page(
        self, viewer: Viewer, title: str, body: str, current: str, live: str, back: str
    ) -> web.Response:
        text = layout(
            viewer,
            title,
            body,
            can_sign_in=self.auth.can_sign_in,
            current=current,
            live=live,
            back=back,
        )
        return _html(text)

    # --------------------------------------------------------------------------- pages

    async def _fleet(self, request: web.Request) -> web.Response:
        if not self.auth.may_read(request):
            return self._refuse()
        fleet = await self.fleet.fleet()
        if request.query.get("part") == "fleet":
            return _html(fleet_page.fleet_part(fleet))
        viewer = self._viewer(request)
        return self._page(viewer, "fleet", fleet_page.page_body(fleet), "fleet", "fleet", "/")

    async def _jobs(self, request: web.Request) -> web.Response:
        if not self.auth.may_read(request):
            return self._refuse()
        query = ListQuery.parse(request.query)
        found = await self.lister.find(query)
        if self._s.held_lanes is not None:
            await self._note_share(found)
        viewer = self._viewer(request)
        now = int(self._s.clock.now_ms())
        if request.query.get("part") == "results":
            return _html(jobs_page.results(viewer, found, now))
        members = sorted({*self._telemetry.live, *self._s.owned_counts})
        body = jobs_page.page_body(viewer, found, members, now)
        return self._page(viewer, "jobs", body, "jobs", "jobs", query.url())

    async def _note_share(self, found: ListResult) -> None:
        """Holding a share, the list shows this replica's jobs only: it says so, and a search
        for the full name of a job held elsewhere links to that job's page (which asks a
        replica that holds it)."""
        s = self._s
        found.share = (
            f"This replica holds {len(s.jobs):,} jobs, its share (scheduler.holders = "
            f"{s.settings.holders}): the list and the search cover those; a job's page shows "
            "any job."
        )
        name = found.query.q
        if not name or name in s.jobs or job_name_problem(name) is not None:
            return
        with contextlib.suppress(ApiError):
            await self._admin.call("jobs.get", msgspec.json.encode({"name": name}))
            found.elsewhere = name

    async def _job(self, request: web.Request) -> web.Response:
        if not self.auth.may_read(request):
            return self._refuse()
        name = request.match_info["name"]
        raw = request.query.get("before", "0")
        if not raw.isdigit() or len(raw) > 19:
            raise BadRequest("before must be a stream sequence (a whole number)")
        viewer = self._viewer(request)
        try:
            view = await self.jobs.view(name, int(raw))
        except ApiError as exc:
            status = 404 if exc.code == "not_found" else 400 if exc.code == "bad_request" else 503
            text = message_page(
                viewer, "No such job", exc.message, can_sign_in=self.auth.can_sign_in, link="/jobs"
            )
            return _html(text, status)
        if request.query.get("part") == "live":
            return _html(job_page.live_part(view))
        done = request.query.get("done", "")
        # Only what an action's redirect writes: a link cannot make the page say anything else.
        done = done if _DONE.fullmatch(done) else ""
        body = job_page.page_body(view, viewer, done)
        return self._page(viewer, name, body, "jobs", f"job:{name}", request.path_qs)

    async def _file(self, request: web.Request) -> web.Response:
        found = (self._static or {}).get(request.match_info["file"])
        if found is None:
            raise web.HTTPNotFound()
        body, kind, tag = found
        headers = {"ETag": tag, "Cache-Control": "no-cache"}
        if request.headers.get("If-None-Match") == tag:
            return web.Response(status=304, headers=headers)
        return web.Response(body=body, content_type=kind, charset="utf-8", headers=headers)

    # ------------------------------------------------------------------- sign in / out

    def _login_body(self, next_url: str, problem: str = "") -> str:
        if not self.auth.has_users:
            return (
                "<h1>Sign in</h1><p>No users are configured on this replica: add "
                "<code>http.users</code> (see <code>hrwcron hash-password</code>), or sign in "
                "through the reverse proxy that sets <code>http.trusted_header</code>.</p>"
            )
        error = f'<p class="bad" id="login-error">{e(problem)}</p>' if problem else ""
        return (
            f"<h1>Sign in</h1>{error}"
            '<form method="post" action="/login" id="login">'
            f'<input type="hidden" name="next" value="{e(next_url)}">'
            '<p><label>name <input name="name" autocomplete="username" required></label></p>'
            '<p><label>password <input name="password" type="password" '
            'autocomplete="current-password" required></label></p>'
            f"<p>{button('sign in', css='primary')}</p></form>"
        )

    async def _login_form(self, request: web.Request) -> web.Response:
        next_url = safe_next(request.query.get("next", "/"))
        body = self._login_body(next_url)
        return self._page(self._viewer(request), "sign in", body, "", "", next_url)

    async def _login(self, request: web.Request) -> web.Response:
        data = await request.post()
        next_url = safe_next(str(data.get("next", "/")))
        typed = str(data.get("name", ""))
        name = typed if USER_NAME.fullmatch(typed) else "(not a user name)"
        if not same_origin(request):
            body = self._login_body(next_url, "refused: the form came from another site")
            page = self._page(Viewer(self._s.node), "sign in", body, "", "", next_url)
            page.set_status(403)
            return page
        try:
            user = await self.auth.sign_in(name, str(data.get("password", "")))
        except SignInRefused as exc:
            self.actions.audit_sign_in(request, name, f"refused: {exc}")
            body = self._login_body(next_url, str(exc))
            return self._page(Viewer(self._s.node), "sign in", body, "", "", next_url)
        self.actions.audit_sign_in(request, user.name, "signed in")
        response = web.HTTPSeeOther(next_url)
        response.set_cookie(
            COOKIE,
            user.session,
            max_age=SESSION_S,
            path="/",
            httponly=True,
            samesite="Strict",
            secure=request.secure,
        )
        raise response

    async def _logout(self, request: web.Request) -> web.Response:
        user = self.auth.user(request)
        data = await request.post()
        if user is not None and self.auth.csrf_ok(request, user, str(data.get("csrf", ""))):
            self.auth.sign_out(user)
            self.actions.audit_sign_in(request, user.name, "signed out")
        response = web.HTTPSeeOther("/")
        response.del_cookie(COOKIE, path="/")
        raise response
