"""A client of the admin API, and the jobs port on top of it that ``hrwcron apply`` uses."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from ..errors import ConflictError, HrwcronError
from ..model import JobSpec
from ..ports import JobEvent
from .api import (
    ADMIN_PREFIX,
    BackfillResult,
    DeleteResult,
    ErrorReply,
    HistoryReply,
    JobEntry,
    JobList,
    PauseResult,
    PutResult,
    StatusReply,
    TriggerResult,
    subject,
)

R = TypeVar("R", bound=msgspec.Struct)

ERROR_CODE_HEADER = "Nats-Service-Error-Code"


class AdminError(HrwcronError):
    """An error reply (or no reply at all): ``code`` says whose problem it is."""

    def __init__(
        self,
        code: str,
        message: str,
        field: str = "",
        problems: Sequence[tuple[str, str]] = (),
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.problems = list(problems)


class AdminClient:
    def __init__(self, client: Client, *, prefix: str = ADMIN_PREFIX, timeout: float = 5.0):
        self.client = client
        self.prefix = prefix
        self.timeout = timeout

    async def call(
        self,
        verb: str,
        request: dict[str, Any],
        reply_type: type[R],
        timeout: float | None = None,
    ) -> R:
        where = subject(verb, self.prefix)
        wait = self.timeout if timeout is None else timeout
        data = msgspec.json.encode(request)
        try:
            reply = await self.client.request(where, data, timeout=wait)
        except MaxPayloadError:
            raise AdminError(
                "too_large",
                f"the request is {len(data)} bytes, more than the NATS server's max_payload "
                f"({self.client.max_payload} bytes)",
            ) from None
        except NoRespondersError:
            raise AdminError(
                "unavailable",
                f"no hrwcron replica answers on {where}: is one running and connected to this "
                "NATS server and account?",
            ) from None
        except (TimeoutError, NatsTimeoutError):
            raise AdminError("unavailable", f"no answer on {where} within {wait:g} s") from None
        headers = reply.headers or {}
        if ERROR_CODE_HEADER in headers:
            raise _error(reply.data, headers)
        try:
            return msgspec.json.decode(reply.data, type=reply_type)
        except msgspec.MsgspecError as exc:
            raise AdminError("internal", f"unexpected reply on {where}: {exc}") from None

    # ----------------------------------------------------------------------------- verbs

    async def list_jobs(
        self, prefix: str = "", after: str = "", limit: int = 1000, *, max_bytes: int = 0
    ) -> JobList:
        """One page: at most ``limit`` jobs and ``max_bytes`` bytes (0: what one reply
        carries); ``page.next`` is the ``after`` of the next page."""
        request = {"prefix": prefix, "after": after, "limit": limit, "max_bytes": max_bytes}
        return await self.call("jobs.list", request, JobList)

    async def all_jobs(self, prefix: str = "", *, max_bytes: int = 0) -> list[JobEntry]:
        found: list[JobEntry] = []
        after = ""
        while True:
            page = await self.list_jobs(prefix, after, limit=1000, max_bytes=max_bytes)
            found.extend(page.jobs)
            if not page.next:
                return found
            after = page.next

    async def get_job(self, name: str) -> JobEntry:
        return await self.call("jobs.get", {"name": name}, JobEntry)

    async def put_job(self, spec: JobSpec, revision: int | None = None) -> PutResult:
        request: dict[str, Any] = {"spec": msgspec.to_builtins(spec)}
        if revision is not None:
            request["revision"] = revision
        return await self.call("jobs.put", request, PutResult)

    async def delete_job(self, name: str, revision: int | None = None) -> DeleteResult:
        request: dict[str, Any] = {"name": name}
        if revision is not None:
            request["revision"] = revision
        return await self.call("jobs.delete", request, DeleteResult)

    async def pause(self, name: str, paused: bool = True) -> PauseResult:
        verb = "jobs.pause" if paused else "jobs.resume"
        return await self.call(verb, {"name": name}, PauseResult)

    async def trigger(
        self, name: str, trigger_id: str = "", *, timeout: float | None = None
    ) -> TriggerResult:
        """With ``trigger_id`` the replica first reads the job's stored triggers for it, which
        for a job firing every second is a day of them: give it time."""
        request = {"name": name, "id": trigger_id} if trigger_id else {"name": name}
        return await self.call("trigger", request, TriggerResult, timeout=timeout)

    async def backfill(
        self, name: str, start: str, end: str, *, dry_run: bool = False, timeout: float = 120.0
    ) -> BackfillResult:
        request = {"name": name, "from": start, "to": end, "dry_run": dry_run}
        return await self.call("backfill", request, BackfillResult, timeout=timeout)

    async def status(
        self,
        name: str = "",
        prefix: str = "",
        limit: int = 1000,
        *,
        after: str = "",
        max_bytes: int = 0,
    ) -> StatusReply:
        """One page of status: at most ``limit`` jobs and ``max_bytes`` bytes (0: what one
        reply carries); ``reply.next`` is the ``after`` of the next page."""
        request = {
            "name": name,
            "prefix": prefix,
            "limit": limit,
            "after": after,
            "max_bytes": max_bytes,
        }
        return await self.call("status", request, StatusReply)

    async def status_pages(
        self, name: str = "", prefix: str = "", limit: int = 1000, *, max_bytes: int = 0
    ) -> AsyncIterator[StatusReply]:
        """Every page of status in turn, each from whichever replica answers."""
        after = ""
        while True:
            page = await self.status(name, prefix, limit, after=after, max_bytes=max_bytes)
            yield page
            if not page.next:
                return
            after = page.next

    async def full_status(self, name: str = "", prefix: str = "") -> StatusReply:
        """Status of every matching job, paged through: the first page's members and replica,
        every page's jobs."""
        first: StatusReply | None = None
        async for page in self.status_pages(name, prefix):
            if first is None:
                first = page
            else:
                first.jobs.extend(page.jobs)
        assert first is not None
        first.truncated = False
        first.next = ""
        return first

    async def history(
        self, name: str, limit: int = 20, *, before: int = 0, max_bytes: int = 0
    ) -> HistoryReply:
        """The newest ``limit`` triggers of ``name`` (older than stream sequence ``before``),
        paged through when they do not fit in one reply."""
        reply: HistoryReply | None = None
        while True:
            request = {
                "name": name,
                "limit": limit - (len(reply.triggers) if reply else 0),
                "before": before,
                "max_bytes": max_bytes,
            }
            page = await self.call("history", request, HistoryReply)
            if reply is None:
                reply = page
            else:
                reply.triggers.extend(page.triggers)
                reply.next = page.next
            if not page.next or len(reply.triggers) >= limit:
                return reply
            before = page.next


def _error(data: bytes, headers: dict[str, str]) -> AdminError:
    try:
        body = msgspec.json.decode(data, type=ErrorReply).error
    except msgspec.MsgspecError:
        code = headers.get(ERROR_CODE_HEADER, "")
        message = headers.get("Nats-Service-Error", "") or f"error {code}"
        return AdminError("internal" if code == "500" else "unavailable", message)
    return AdminError(
        body.code, body.message, body.field, [(p.field, p.message) for p in body.problems]
    )


class ApiJobs:
    """The jobs port over the admin API, so declarative sync needs no bucket permissions and
    every write is validated by a replica. Writes keep their compare-and-set revision."""

    def __init__(self, admin: AdminClient) -> None:
        self._admin = admin

    async def snapshot(self) -> dict[str, JobEvent]:
        return {e.name: _event(e) for e in await self._admin.all_jobs()}

    async def get(self, name: str) -> JobEvent | None:
        try:
            return _event(await self._admin.get_job(name))
        except AdminError as exc:
            if exc.code == "not_found":
                return None
            raise

    async def put(self, spec: JobSpec, last_revision: int | None) -> int:
        try:
            return (await self._admin.put_job(spec, last_revision)).revision
        except AdminError as exc:
            if exc.code == "conflict":
                raise ConflictError(exc.message) from None
            raise

    async def delete(self, name: str, last_revision: int | None) -> None:
        try:
            await self._admin.delete_job(name, last_revision)
        except AdminError as exc:
            if exc.code == "conflict":
                raise ConflictError(exc.message) from None
            raise

    def watch(self) -> AsyncIterator[JobEvent | None]:
        raise NotImplementedError("the admin API does not stream job changes")


def _event(entry: JobEntry) -> JobEvent:
    return JobEvent(entry.name, entry.spec, entry.revision, entry.error)
