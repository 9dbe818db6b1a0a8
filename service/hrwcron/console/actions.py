"""What a signed-in user can do from the console: pause, resume, trigger, backfill (a dry run
first), delete (after typing the name), and pause or resume many jobs at once.

Each action is one request to the admin API's own handler (``AdminService.call``): decoded,
validated and refused exactly as the CLI's would be. Every attempt leaves an audit line in the
replica's log naming who did what, and what came of it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from hrwcron.adapters.http import BadRequest, page_headers
from hrwcron.admin.api import ERROR_CODES, BackfillResult, PauseResult, TriggerResult
from hrwcron.admin.replies import ApiError
from hrwcron.admin.service import AdminService
from hrwcron.console import action_pages
from hrwcron.console.auth import Auth, User
from hrwcron.console.html import CSP, Viewer, button, e, form, job_url, layout, message_page
from hrwcron.console.listing import ListQuery

audit = logging.getLogger("hrwcron.audit")

MAX_BULK = 200
# The most jobs one "all matching" pause or resume acts on: past it, narrow the search.
MAX_ALL = 10_000
_DONE = {"pause": "paused", "resume": "resumed"}

Page = Callable[[Viewer, str, str, str], str]
Matching = Callable[[ListQuery, int], Awaitable[tuple[list[str], int]]]
"""Every job a query finds and how many (no names past the given most): Lister.matching."""


class Actions:
    def __init__(self, admin: AdminService, auth: Auth, node: str, matching: Matching) -> None:
        self._admin = admin
        self._auth = auth
        self._node = node
        self._matching = matching
        self.refused = 0  # actions refused for want of a signed-in user or a valid form

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/jobs/bulk", self._guard(self._bulk))
        app.router.add_post("/jobs/bulk-all", self._guard(self._bulk_all))
        app.router.add_post("/jobs/{name}/pause", self._guard(self._pause))
        app.router.add_post("/jobs/{name}/resume", self._guard(self._resume))
        app.router.add_post("/jobs/{name}/trigger", self._guard(self._trigger))
        app.router.add_post("/jobs/{name}/backfill", self._guard(self._backfill))
        app.router.add_post("/jobs/{name}/delete", self._guard(self._delete))
        app.router.add_get("/jobs/{name}/delete", self._confirm_delete)

    # ------------------------------------------------------------------------- plumbing

    def _viewer(self, user: User | None) -> Viewer:
        return Viewer(self._node, user.name, user.csrf) if user else Viewer(self._node)

    def _page(self, viewer: Viewer, status: int, title: str, text: str, link: str) -> web.Response:
        body = message_page(viewer, title, text, can_sign_in=self._auth.can_sign_in, link=link)
        return _html(body, status)

    def _guard(
        self, handler: Callable[[web.Request, User, Any], Awaitable[web.Response]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        """Only a signed-in user with this session's CSRF token may act; anything else is
        refused before the form is looked at further, and logged."""

        async def guarded(request: web.Request) -> web.Response:
            user = self._auth.user(request)
            data = await request.post()
            name = request.match_info.get("name", "")
            what = request.path.rsplit("/", 1)[-1]
            if user is None:
                self._refuse(request, what, name, "not signed in")
                return self._page(
                    Viewer(self._node),
                    403,
                    "Sign in to act",
                    "This console is read-only without signing in; nothing was changed.",
                    f"/login?next={job_url(name) if name else '/jobs'}",
                )
            if not self._auth.csrf_ok(request, user, str(data.get("csrf", ""))):
                self._refuse(request, what, name, f"{user.name}: bad or missing CSRF token")
                return self._page(
                    self._viewer(user),
                    403,
                    "Refused",
                    "The form was stale or came from another site; nothing was changed. "
                    "Reload the page and try again.",
                    job_url(name) if name else "/jobs",
                )
            return await handler(request, user, data)

        return guarded

    def audit_sign_in(self, request: web.Request, name: str, outcome: str) -> None:
        audit.info(
            "audit: %s from %s: %s",
            name or "(no name)",
            request.remote,
            outcome,
            extra={"user": name, "action": "sign-in"},
        )

    def _refuse(self, request: web.Request, what: str, name: str, why: str) -> None:
        self.refused += 1
        if self.refused % 100 == 1:  # the first, then every 100th: no flood from a script
            audit.warning(
                "audit: refused %s %s from %s: %s (%d refused so far)",
                what,
                name or "(bulk)",
                request.remote,
                why,
                self.refused,
            )

    async def _call(
        self, request: web.Request, user: User, verb: str, body: dict[str, Any]
    ) -> msgspec.Struct:
        """One admin request for ``user``; the audit line says what came of it."""
        target = body.get("name", "")
        try:
            reply = await self._admin.call(verb, msgspec.json.encode(body))
        except ApiError as exc:
            audit.info(
                "audit: %s %s %s from %s: refused (%s: %s)",
                user.name,
                verb,
                target,
                request.remote,
                exc.code,
                exc.message[:300],
                extra={"user": user.name, "action": verb, "job": target},
            )
            raise
        audit.info(
            "audit: %s %s %s from %s: %s",
            user.name,
            verb,
            target,
            request.remote,
            _summary(reply),
            extra={"user": user.name, "action": verb, "job": target},
        )
        return reply

    def _refused(self, user: User, exc: ApiError, link: str) -> web.Response:
        status = int(ERROR_CODES.get(exc.code, "500"))
        return self._page(self._viewer(user), status, "Refused", exc.message, link)

    # --------------------------------------------------------------------------- actions

    async def _pause(self, request: web.Request, user: User, data: Any) -> web.Response:
        return await self._toggle(request, user, "pause")

    async def _resume(self, request: web.Request, user: User, data: Any) -> web.Response:
        return await self._toggle(request, user, "resume")

    async def _toggle(self, request: web.Request, user: User, what: str) -> web.Response:
        name = request.match_info["name"]
        try:
            reply = await self._call(request, user, f"jobs.{what}", {"name": name})
        except ApiError as exc:
            return self._refused(user, exc, job_url(name))
        assert isinstance(reply, PauseResult)
        done = f"{_DONE[what]} (revision {reply.revision})" if reply.changed else "no change"
        raise web.HTTPSeeOther(job_url(name, done=done))

    async def _trigger(self, request: web.Request, user: User, data: Any) -> web.Response:
        name = request.match_info["name"]
        body = {"name": name}
        if str(data.get("id", "")).strip():
            body["id"] = str(data["id"]).strip()
        try:
            reply = await self._call(request, user, "trigger", body)
        except ApiError as exc:
            return self._refused(user, exc, job_url(name))
        assert isinstance(reply, TriggerResult)
        raise web.HTTPSeeOther(job_url(name, done=f"triggered {reply.tick}: {reply.outcome}"))

    async def _backfill(self, request: web.Request, user: User, data: Any) -> web.Response:
        """A dry run first, shown with a button that publishes exactly that range."""
        name = request.match_info["name"]
        publish = data.get("step") == "publish"
        body = {
            "name": name,
            "from": str(data.get("from", "")).strip(),
            "to": str(data.get("to", "")).strip(),
            "dry_run": not publish,
        }
        try:
            reply = await self._call(request, user, "backfill", body)
        except ApiError as exc:
            return self._refused(user, exc, job_url(name))
        assert isinstance(reply, BackfillResult)
        viewer = self._viewer(user)
        return _html(
            layout(
                viewer,
                f"backfill {name}",
                action_pages.backfill(viewer, reply, body),
                can_sign_in=True,
                current="jobs",
                back=job_url(name),
            )
        )

    async def _confirm_delete(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        user = self._auth.user(request)
        if user is None:
            raise web.HTTPSeeOther(f"/login?next={job_url(name)}/delete")
        viewer = self._viewer(user)
        inner = (
            f'<p>Deleting <b class="mono">{e(name)}</b> stops its ticks on every replica; its '
            "triggers stay in the stream. Type the job's name to confirm.</p>"
            f'<input name="confirm" required autocomplete="off" aria-label="job name"> '
            + button("delete", css="danger")
        )
        body = f"<h1>Delete a job</h1>{form(viewer, f'{job_url(name)}/delete', inner)}"
        body += f'<p><a href="{e(job_url(name))}">cancel</a></p>'
        page = layout(viewer, f"delete {name}", body, can_sign_in=True, current="jobs")
        return _html(page)

    async def _delete(self, request: web.Request, user: User, data: Any) -> web.Response:
        name = request.match_info["name"]
        if data.get("confirm") != name:
            return self._page(
                self._viewer(user),
                400,
                "Not deleted",
                "The name typed does not match the job's: nothing was deleted.",
                f"{job_url(name)}/delete",
            )
        try:
            await self._call(request, user, "jobs.delete", {"name": name})
        except ApiError as exc:
            return self._refused(user, exc, job_url(name))
        return self._page(self._viewer(user), 200, "Deleted", f"job {name} deleted", "/jobs")

    async def _bulk(self, request: web.Request, user: User, data: Any) -> web.Response:
        what = data.get("action")
        names = [str(n) for n in data.getall("name", [])]
        if what not in _DONE or not names or len(names) > MAX_BULK:
            return self._page(
                self._viewer(user),
                400,
                "Nothing done",
                f"choose pause or resume and 1 to {MAX_BULK} jobs",
                "/jobs",
            )
        outcomes = await self._each(request, user, what, names)
        return self._bulk_result(user, what, names, outcomes)

    async def _each(
        self, request: web.Request, user: User, what: str, names: list[str]
    ) -> list[str]:
        """``jobs.pause`` or ``jobs.resume`` for each name in turn, each an admin request
        with its audit line; what came of each."""
        outcomes = []
        for name in names:
            try:
                reply = await self._call(request, user, f"jobs.{what}", {"name": name})
                assert isinstance(reply, PauseResult)
                outcomes.append(_DONE[what] if reply.changed else "no change")
            except ApiError as exc:
                outcomes.append(f"refused: {exc.message}")
        return outcomes

    def _bulk_result(
        self, user: User, what: str, names: list[str], outcomes: list[str]
    ) -> web.Response:
        viewer = self._viewer(user)
        body = action_pages.bulk_result(what, _DONE[what], names, outcomes)
        return _html(layout(viewer, f"bulk {what}", body, can_sign_in=True, current="jobs"))

    async def _bulk_all(self, request: web.Request, user: User, data: Any) -> web.Response:
        """Every job the search and its filters find: the first post asks to confirm, naming
        how many; the confirmed one acts only if the count is still the one confirmed."""
        viewer = self._viewer(user)
        what = str(data.get("action", ""))
        fields = {k: str(data.get(k, "")) for k in ("q", "state", "tag", "owner", "missed")}
        try:
            query = ListQuery.parse(fields)
        except BadRequest as exc:
            return self._page(viewer, 400, "Nothing done", str(exc), "/jobs")
        back = query.url()
        if what not in _DONE:
            return self._page(viewer, 400, "Nothing done", "choose pause or resume", back)
        names, total = await self._matching(query, MAX_ALL)
        if total > MAX_ALL:
            text = (
                f"{total:,} jobs match {query.described()}: one action takes at most "
                f"{MAX_ALL:,}. Narrow the search or the filters; nothing was changed."
            )
            return self._page(viewer, 400, "Too many jobs", text, back)
        if not total:
            return self._page(viewer, 400, "Nothing done", "no job matches: nothing changed", back)
        confirmed = str(data.get("confirm", ""))
        if confirmed != str(total):
            body = action_pages.confirm_all(viewer, what, query, total, confirmed)
            title = f"{what} all matching"
            return _html(layout(viewer, title, body, can_sign_in=True, current="jobs"))
        outcomes = await self._each(request, user, what, names)
        audit.info(
            "audit: %s jobs.%s all %d matching %s from %s: %d changed, %d refused",
            user.name,
            what,
            total,
            query.described(),
            request.remote,
            outcomes.count(_DONE[what]),
            sum(o.startswith("refused") for o in outcomes),
            extra={"user": user.name, "action": f"jobs.{what}", "job": query.described()},
        )
        return self._bulk_result(user, what, names, outcomes)


def _summary(reply: msgspec.Struct) -> str:
    if isinstance(reply, PauseResult):
        return f"{'changed' if reply.changed else 'unchanged'} (revision {reply.revision})"
    if isinstance(reply, TriggerResult):
        return f"{reply.tick} {reply.outcome}"
    if isinstance(reply, BackfillResult):
        verb = "would publish" if reply.dry_run else "published"
        return f"{verb} {len(reply.published)}, present {len(reply.present)}"
    return "done"


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(
        text=text,
        status=status,
        content_type="text/html",
        charset="utf-8",
        headers=page_headers(CSP),
    )
