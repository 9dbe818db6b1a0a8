"""The admin API as a NATS micro service, served by every replica in one queue group.

Every request is validated completely before anything is written: a refused request changes
nothing. Writes to the jobs bucket go through the same port the replicas watch, so a change is
live on every replica as soon as the watch delivers it. Firing by hand and backfilling go
through the engine's claim and fenced publish, never around it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from nats.errors import ConnectionClosedError, NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import APIError, ServiceUnavailableError
from nats.micro import add_service
from nats.micro.request import Request
from nats.micro.service import Service

from hrwcron import __version__
from hrwcron.admin.api import (
    ERROR_CODES,
    QUEUE_GROUP,
    REPLY_TYPES,
    REQUEST_TYPES,
    SERVICE_NAME,
    ErrorReply,
    RequestProblem,
    decode_request,
    subject,
)
from hrwcron.admin.context import REPLY_PREFIXES
from hrwcron.admin.forward import node_subject, relayed_error
from hrwcron.admin.job_verbs import JobVerbs
from hrwcron.admin.replies import (
    MAX_ERROR_REPLY,
    REPLY_RESERVE,
    TOO_LARGE_HINTS,
    ApiError,
    bad,
    error_reply,
)
from hrwcron.admin.run_verbs import RunVerbs
from hrwcron.core.errors import (
    ConflictError,
    InvalidInput,
    NotFoundError,
    SubjectTakenError,
)
from hrwcron.engine.ports import (
    StoreUnavailable,
)

log = logging.getLogger("hrwcron.admin")

Handler = Callable[[Any], Awaitable[msgspec.Struct]]

# How long start() waits for the server to confirm the endpoints' subscriptions.
FLUSH_TIMEOUT_S = 5


class AdminService(JobVerbs, RunVerbs):
    """The admin API as a NATS micro service: one endpoint a verb, each request decoded, handed
    to its verb's handler and answered (or refused with a reply that fits one message)."""

    @property
    def _handlers(self) -> dict[str, Handler]:
        """Each verb's handler; the table is read once, when the endpoints are added."""
        return {
            "jobs.list": self.list_jobs,
            "jobs.get": self.get_job,
            "jobs.put": self.put_job,
            "jobs.bulk": self.put_jobs,
            "jobs.delete": self.delete_job,
            "jobs.pause": self.pause_job,
            "jobs.resume": self.resume_job,
            "trigger": self.trigger,
            "backfill": self.backfill,
            "status": self.status,
            "history": self.history,
        }

    def _handler_of(self, verb: str) -> Handler:
        return self._handlers[verb]

    @property
    def service(self) -> Service | None:
        return self._service

    async def start(self) -> None:
        settings = self._scheduler.settings
        service = await add_service(
            self._client,
            name=SERVICE_NAME,
            version=__version__,
            description="hrwcron admin API: jobs, manual triggers, backfill, status, history",
            metadata={"node": settings.node_id, "prefix": self.prefix},
            queue_group=QUEUE_GROUP,
        )
        node = settings.node_id
        try:
            for verb, handler in self._handlers.items():
                await service.add_endpoint(
                    name=verb.replace(".", "-"),
                    subject=subject(verb, self.prefix),
                    handler=self._endpoint(verb, handler, send_on=settings.holders > 0),
                )
                if settings.holders > 0:
                    # This replica's own subjects: what other replicas send on to it.
                    await service.add_endpoint(
                        name=f"node-{verb.replace('.', '-')}",
                        subject=node_subject(self.prefix, node, verb),
                        queue_group=f"{QUEUE_GROUP}-{node}",
                        handler=self._endpoint(verb, handler, send_on=False),
                    )
            # The server holds the subscriptions before anyone is told the API is up: a
            # request sent the moment "started" is logged finds its responder.
            await self._client.flush(timeout=FLUSH_TIMEOUT_S)
        except BaseException:
            await service.stop()
            raise
        self._service = service
        log.info("admin API on %s.> (queue group %s)", self.prefix, QUEUE_GROUP)

    async def stop(self) -> None:
        if self._service is not None:
            await self._service.stop()
            self._service = None

    async def call(self, verb: str, data: bytes) -> msgspec.Struct:
        """One request in this process, decoded, served and refused exactly as one over NATS
        (the console acts through it); raises ApiError with the reply's code and message."""
        try:
            try:
                parsed = decode_request(data, REQUEST_TYPES[verb])
            except RequestProblem as exc:
                raise bad(exc.field, exc.message) from None
            answer = await self._send_to_holder(verb, parsed, data)
            if answer is not None:
                if relayed_error(answer) is not None:
                    error = msgspec.json.decode(answer.data, type=ErrorReply).error
                    raise ApiError(error.code, error.message, error.field)
                return msgspec.json.decode(answer.data, type=REPLY_TYPES[verb])
            return await self._handlers[verb](parsed)
        except Exception as exc:
            raise self._error(verb, exc) from None

    # ------------------------------------------------------------------------- plumbing

    def _endpoint(
        self, verb: str, handler: Handler, *, send_on: bool = False
    ) -> Callable[[Request], Awaitable[None]]:
        """``send_on``: a request about a job another replica holds goes on to it."""
        request_type = REQUEST_TYPES[verb]

        async def serve(request: Request) -> None:
            # nats.micro's Request does not expose the reply subject; its message does.
            reply_to = request._msg.reply or ""
            if not reply_to.startswith(REPLY_PREFIXES):
                self._refuse_reply(verb, reply_to)
                return
            try:
                try:
                    parsed = decode_request(request.data, request_type)
                except RequestProblem as exc:
                    raise bad(exc.field, exc.message) from None
                answer = await self._send_to_holder(verb, parsed, request.data) if send_on else None
                if answer is not None:
                    relayed = relayed_error(answer)
                    if relayed is None:
                        await request.respond(answer.data)
                    else:
                        await request.respond_error(relayed[0], relayed[1], data=answer.data)
                    return
                reply = msgspec.json.encode(await handler(parsed))
                limit = self._client.max_payload
                if len(reply) > limit:
                    raise ApiError(
                        "too_large",
                        f"the reply would be {len(reply)} bytes, more than the server's "
                        f"max_payload ({limit}){TOO_LARGE_HINTS.get(verb, '')}",
                    )
            except Exception as exc:
                error = self._error(verb, exc)
                limit = min(MAX_ERROR_REPLY, self._client.max_payload - REPLY_RESERVE)
                await request.respond_error(
                    ERROR_CODES[error.code],
                    error.message.replace("\r", " ").replace("\n", " ")[:512],
                    data=error_reply(error.body(), limit),
                )
                return
            await request.respond(reply)

        return serve

    def _refuse_reply(self, verb: str, reply_to: str) -> None:
        """A reply subject that is not an inbox would have this replica publish, with its own
        rights, on a subject of the requester's choosing (a bucket key, a trigger subject):
        the request is dropped unanswered, counted, and logged (the first and every 100th)."""
        self.refused_replies += 1
        if self._on_refused is not None:
            self._on_refused()
        if self.refused_replies % 100 == 1:
            log.warning(
                "admin %s request refused: its reply subject %r is not an inbox (it starts "
                "with none of %s); %d refused so far",
                verb,
                reply_to[:120],
                ", ".join(REPLY_PREFIXES),
                self.refused_replies,
            )

    @staticmethod
    def _error(verb: str, exc: Exception) -> ApiError:
        if isinstance(exc, ApiError):
            return exc
        if isinstance(exc, SubjectTakenError):
            return ApiError("conflict", f"spec.subject: {exc}", "spec.subject")
        if isinstance(exc, ConflictError):
            return ApiError("conflict", str(exc), "revision")
        if isinstance(exc, NotFoundError):
            return ApiError("not_found", str(exc), "name")
        if isinstance(exc, InvalidInput):
            return ApiError("bad_request", str(exc), exc.field, exc.problems)
        unavailable = (
            StoreUnavailable,
            TimeoutError,
            NatsTimeoutError,
            NoRespondersError,
            ConnectionClosedError,
            ServiceUnavailableError,
            APIError,
        )
        if isinstance(exc, unavailable):
            return ApiError("unavailable", f"NATS did not serve the request: {exc!r}; retry")
        log.exception("admin %s failed", verb)
        return ApiError("internal", f"{type(exc).__name__}: {exc}")
