"""A client of the admin API, and the jobs port on top of it that ``hrwcron apply`` uses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import msgspec
from nats.aio.client import Client
from nats.errors import MaxPayloadError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from hrwcron.admin.api import (
    ADMIN_PREFIX,
    MAX_LIST,
    BackfillResult,
    BulkResult,
    DeleteResult,
    HistoryReply,
    JobEntry,
    JobList,
    JobOutcome,
    PauseResult,
    PutResult,
    StatusReply,
    TriggerResult,
    subject,
)
from hrwcron.admin.bulk_items import chunks, delete_item, oversized, put_item, too_big
from hrwcron.admin.client_errors import (
    ERROR_CODE_HEADER,
    AdminError,
    Refused,
    error_from_reply,
    unanswered,
)
from hrwcron.core.errors import ConflictError
from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import JobEvent

__all__ = ["AdminClient", "AdminError", "ApiJobs"]

R = TypeVar("R", bound=msgspec.Struct)

# A bulk request carries at most this much (and never more than the server's max_payload
# allows): big enough that per-request costs vanish, small enough that a few are in flight at
# once and progress moves steadily.
BULK_REQUEST_BYTES = 256 * 1024
# Room in a request for its envelope besides the items, and in a message for NATS's framing.
BULK_ENVELOPE = 1024
BULK_IN_FLIGHT = 4
# A bulk request writes thousands of jobs: it may take longer than a single one.
BULK_TIMEOUT = 60.0
# How long reads and bulk writes keep asking while replicas answer that they are still
# loading job changes (after a large apply, every replica loads every job), and the pauses.
LOADING_PATIENCE = 120.0
FIRST_RETRY_S = 0.2
MAX_RETRY_S = 2.0


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
        return await self.call_raw(verb, msgspec.json.encode(request), reply_type, timeout)

    async def call_raw(
        self,
        verb: str,
        data: bytes,
        reply_type: type[R],
        timeout: float | None = None,
        *,
        patience: float = 0.0,
    ) -> R:
        """``call`` with a request body that is already JSON. A replica that answers
        ``unavailable`` (it is still loading job changes, say) did nothing: for up to
        ``patience`` seconds the request is sent again, to whichever replica answers."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + patience
        pause = FIRST_RETRY_S
        while True:
            try:
                return await self._call_once(verb, data, reply_type, timeout)
            except Refused as exc:
                if exc.error.code != "unavailable" or loop.time() + pause > give_up:
                    raise exc.error from None
            await asyncio.sleep(pause)
            pause = min(MAX_RETRY_S, pause * 2)

    async def _call_once(
        self, verb: str, data: bytes, reply_type: type[R], timeout: float | None
    ) -> R:
        where = subject(verb, self.prefix)
        wait = self.timeout if timeout is None else timeout
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
            raise Refused(error_from_reply(reply.data, headers))
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
        data = msgspec.json.encode(request)
        return await self.call_raw("jobs.list", data, JobList, patience=LOADING_PATIENCE)

    async def all_jobs(
        self,
        prefix: str = "",
        *,
        max_bytes: int = 0,
        progress: Callable[[int, int], None] | None = None,
    ) -> list[JobEntry]:
        """Every job, page after page of as many as a reply carries; ``progress(read,
        total)`` after each page."""
        found: list[JobEntry] = []
        after = ""
        while True:
            page = await self.list_jobs(prefix, after, limit=MAX_LIST, max_bytes=max_bytes)
            found.extend(page.jobs)
            if progress is not None:
                progress(len(found), max(page.total, len(found)))
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

    async def bulk(
        self,
        puts: Sequence[bytes],
        deletes: Sequence[bytes] = (),
        *,
        atomic: bool = False,
        dry_run: bool = False,
        timeout: float | None = None,
    ) -> BulkResult:
        """One ``jobs.bulk`` request of items already encoded (see :func:`put_item`)."""
        data = b"".join(
            [
                b'{"jobs":[',
                b",".join(puts),
                b'],"delete":[',
                b",".join(deletes),
                b'],"atomic":',
                b"true" if atomic else b"false",
                b',"dry_run":',
                b"true" if dry_run else b"false",
                b"}",
            ]
        )
        wait = max(self.timeout, BULK_TIMEOUT) if timeout is None else timeout
        return await self.call_raw("jobs.bulk", data, BulkResult, wait, patience=LOADING_PATIENCE)

    async def write_jobs(
        self,
        puts: Sequence[tuple[JobSpec, int | None]],
        deletes: Sequence[tuple[str, int | None]] = (),
        *,
        atomic: bool = False,
        dry_run: bool = False,
        in_flight: int = BULK_IN_FLIGHT,
        progress: Callable[[int], None] | None = None,
    ) -> tuple[list[JobOutcome], list[JobOutcome]]:
        """Every write and deletion, in ``jobs.bulk`` requests as large as the server's
        max_payload allows, ``in_flight`` of them at a time; an answer per item, in order.
        ``atomic`` holds for each request on its own. ``progress(items)`` after each one."""
        budget = min(BULK_REQUEST_BYTES, self.client.max_payload - BULK_ENVELOPE)
        put_items = [put_item(spec, revision) for spec, revision in puts]
        delete_items = [delete_item(name, revision) for name, revision in deletes]
        put_answers: list[JobOutcome | None] = [None] * len(puts)
        delete_answers: list[JobOutcome | None] = [None] * len(deletes)
        requests: list[tuple[list[int], list[int]]] = []
        for index, size in oversized(put_items, budget):
            put_answers[index] = too_big(puts[index][0].name, size, self.client.max_payload)
        fitting = [i for i, answer in enumerate(put_answers) if answer is None]
        requests += [(chunk, []) for chunk in chunks(put_items, fitting, budget)]
        requests += [([], chunk) for chunk in chunks(delete_items, range(len(deletes)), budget)]
        slots = asyncio.Semaphore(in_flight)
        done = 0

        async def send(put_indexes: list[int], delete_indexes: list[int]) -> None:
            nonlocal done
            async with slots:
                try:
                    result = await self.bulk(
                        [put_items[i] for i in put_indexes],
                        [delete_items[i] for i in delete_indexes],
                        atomic=atomic,
                        dry_run=dry_run,
                    )
                    answers = result.jobs + result.deleted
                except AdminError as exc:
                    names = [puts[i][0].name for i in put_indexes]
                    names += [deletes[i][0] for i in delete_indexes]
                    answers = [unanswered(name, exc) for name in names]
            for index, answer in zip(put_indexes, answers, strict=False):
                put_answers[index] = answer
            for index, answer in zip(delete_indexes, answers[len(put_indexes) :], strict=False):
                delete_answers[index] = answer
            done += len(put_indexes) + len(delete_indexes)
            if progress is not None:
                progress(done)

        await asyncio.gather(*(send(p, d) for p, d in requests))
        missing = AdminError("internal", "the replica's answer left this job out")
        return (
            [a or unanswered(puts[i][0].name, missing) for i, a in enumerate(put_answers)],
            [a or unanswered(deletes[i][0], missing) for i, a in enumerate(delete_answers)],
        )

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
        order: str = "name",
    ) -> StatusReply:
        """One page of status: at most ``limit`` jobs and ``max_bytes`` bytes (0: what one
        reply carries), by name or soonest due first (``order``); ``reply.next`` is the
        ``after`` of the next page."""
        request = {
            "name": name,
            "prefix": prefix,
            "limit": limit,
            "after": after,
            "max_bytes": max_bytes,
            "order": order,
        }
        return await self.call("status", request, StatusReply)

    async def status_pages(
        self,
        name: str = "",
        prefix: str = "",
        limit: int = 1000,
        *,
        max_bytes: int = 0,
        order: str = "name",
    ) -> AsyncIterator[StatusReply]:
        """Every page of status in turn, each from whichever replica answers."""
        after = ""
        while True:
            page = await self.status(
                name, prefix, limit, after=after, max_bytes=max_bytes, order=order
            )
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


class ApiJobs:
    """The jobs port over the admin API, so declarative sync needs no bucket permissions and
    every write is validated by a replica. Writes keep their compare-and-set revision."""

    def __init__(
        self, admin: AdminClient, *, progress: Callable[[int, int], None] | None = None
    ) -> None:
        self._admin = admin
        self._progress = progress

    async def snapshot(self) -> dict[str, JobEvent]:
        entries = await self._admin.all_jobs(progress=self._progress)
        return {e.name: _event(e) for e in entries}

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
