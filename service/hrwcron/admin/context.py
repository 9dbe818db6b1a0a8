"""What every admin handler shares: the stores, this replica's view of the jobs, and the
lookups in them that wait briefly for a write made through another replica."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.micro.service import Service

from hrwcron.admin.api import (
    ADMIN_PREFIX,
)
from hrwcron.admin.forward import holder_for, relayed_error, send_to
from hrwcron.admin.replies import CATCH_UP_S, REPLY_RESERVE, ApiError, Page
from hrwcron.core.errors import Problem
from hrwcron.core.model import TRIGGER_ENVELOPE, JobSpec
from hrwcron.core.plan import Allowance
from hrwcron.engine.ports import (
    JobEvent,
    JobsPort,
    TriggersPort,
)
from hrwcron.engine.queries import EngineQueries

R = TypeVar("R", bound=msgspec.Struct)

# Jobs a reading handler walks before it lets the event loop run ticks again.
SLICE = 5_000
# Reply subjects a replica answers on: a client's inbox, and the private reply subject the
# server gives a request that came through a service import from another account.
REPLY_PREFIXES = ("_INBOX.", "_R_.")


class ServiceContext:
    """The state and the lookups the handlers of every verb family use."""

    def __init__(
        self,
        client: Client,
        scheduler: EngineQueries,
        jobs: JobsPort,
        triggers: TriggersPort,
        *,
        duplicate_window: float,
        prefix: str = ADMIN_PREFIX,
        on_refused_reply: Callable[[], None] | None = None,
    ) -> None:
        self._client = client
        self._scheduler = scheduler
        self._jobs = jobs
        self._triggers = triggers
        self._duplicate_window = duplicate_window
        self.prefix = prefix
        # Every stored job name, sorted, as of a jobs revision: pages of a listing find their
        # place in it by bisection instead of sorting 100,000 names for each page.
        self._names: tuple[int, list[str]] = (-1, [])
        # The names this replica lists for a listing merged from every member's share.
        self._listed: tuple[tuple[int, int], list[str]] = ((-1, -1), [])
        self._service: Service | None = None  # the micro service, once started
        self.refused_replies = 0  # requests dropped for a reply subject that is no inbox
        self.sent_on = 0  # requests about a job held elsewhere, sent on to a holder
        self._on_refused = on_refused_reply

    async def _stored(self, name: str) -> JobEvent:
        event = await self._jobs.get(name)
        if event is None:
            raise ApiError("not_found", f"no job named {name!r}", "name")
        return event

    async def _loaded(self, name: str) -> Any:
        """This replica's running copy of ``name``, waiting briefly for the jobs watch when the
        bucket already holds a newer revision (the job was just written through another
        replica)."""
        stored = await self._stored(name)
        if stored.spec is None:
            raise ApiError(
                "conflict", f"job {name!r} is stored but invalid ({stored.error}): put a new spec"
            )
        if name not in self._scheduler.jobs:
            # Written around the API (straight into the bucket): the replicas skip it.
            problems = self._spec_problems(stored.spec)
            if problems:
                found = "; ".join(map(str, problems))[:1000]
                raise ApiError(
                    "conflict", f"job {name!r} is stored but invalid ({found}): put a new spec"
                )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S
        while True:
            job = self._scheduler.jobs.get(name)
            if job is not None and job.revision >= stored.revision:
                return job
            if loop.time() > deadline:
                raise ApiError(
                    "unavailable",
                    f"this replica has not loaded revision {stored.revision} of {name!r} yet; "
                    "retry",
                )
            await asyncio.sleep(0.05)

    async def _ask_every_member(
        self, verb: str, request: msgspec.Struct, reply_type: type[R]
    ) -> list[R]:
        """``request`` asked of every live member on its own subjects (of this replica in
        process), each answer decoded; ``unavailable`` when one of them does not answer."""
        scheduler = self._scheduler

        async def ask(node: str) -> R:
            if node == scheduler.node:
                answer: Any = await self._handler_of(verb)(request)
                return cast(R, answer)
            try:
                msg = await send_to(
                    self._client, self.prefix, node, verb, msgspec.json.encode(request)
                )
            except Exception as exc:
                raise ApiError(
                    "unavailable", f"replica {node} did not answer its share ({exc!r}); retry"
                ) from None
            relayed = relayed_error(msg)
            if relayed is not None:
                raise ApiError(
                    "unavailable", f"replica {node} could not answer its share: {relayed[1]}"
                )
            return msgspec.json.decode(msg.data, type=reply_type)

        return list(await asyncio.gather(*(ask(node) for node in scheduler.live_nodes)))

    async def _send_to_holder(self, verb: str, request: Any, data: bytes) -> Msg | None:
        """The reply of a holder of the job ``request`` is about, when this replica holds a
        share without it; None to serve the request here."""
        holder = holder_for(self._scheduler, verb, request)
        if holder is None:
            return None
        self.sent_on += 1
        return await send_to(self._client, self.prefix, holder, verb, data)

    def _handler_of(self, verb: str) -> Callable[[Any], Awaitable[msgspec.Struct]]:
        raise NotImplementedError  # the service's table of handlers

    def _page(self, max_bytes: int, envelope: msgspec.Struct) -> Page:
        """A page of at most ``max_bytes`` (0: as much as one message carries)."""
        hard = self._client.max_payload - REPLY_RESERVE
        return Page(min(max_bytes, hard) if max_bytes else hard, hard, envelope)

    async def _caught_up(self) -> bool:
        """Whether this replica's jobs view holds every revision the bucket held when asked,
        waiting up to CATCH_UP_S for its watch; a write through another replica a moment ago
        is then in the view."""
        newest = await self._jobs.last_revision()
        if self._scheduler.settings.holders > 0:
            self._jobs.nudge()  # its watches see the bucket move in lanes they do not hold
        loop = asyncio.get_running_loop()
        deadline = loop.time() + CATCH_UP_S
        while self._scheduler.jobs_revision < newest:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def _stored_names(self) -> list[str]:
        """Every stored job name (loaded or skipped), sorted; rebuilt only when the view has
        changed since the last listing."""
        scheduler = self._scheduler
        revision = scheduler.jobs_revision
        if self._names[0] != revision:
            self._names = (revision, sorted([*scheduler.jobs, *scheduler.skipped]))
        return self._names[1]

    def _spec_problems(self, spec: JobSpec, allowance: Allowance | None = None) -> list[Problem]:
        """Every problem of a spec written now; a bulk request checks its items on one
        ``allowance`` of search steps, so its cost is bounded whatever it holds."""
        settings = self._scheduler.settings
        found = [
            Problem(f"spec.{p.where}" if p.where else "spec", p.message)
            for p in spec.problems(
                prefix=settings.subject_prefix,
                max_payload=settings.max_payload,
                allowance=allowance,
            )
        ]
        if not any(p.where == "spec.payload" for p in found):
            size = len(msgspec.json.encode(spec.payload))
            server = self._client.max_payload
            if size + TRIGGER_ENVELOPE > server:
                found.append(
                    Problem(
                        "spec.payload",
                        f"is {size} bytes as JSON; with its trigger's envelope "
                        f"({TRIGGER_ENVELOPE} bytes) that is more than the NATS server's "
                        f"max_payload ({server} bytes)",
                    )
                )
        if spec.max_lateness > self._duplicate_window:
            found.append(
                Problem(
                    "spec.max_lateness",
                    f"is {spec.max_lateness:g} s, longer than the trigger stream's duplicate "
                    f"window ({self._duplicate_window:g} s)",
                )
            )
        return found
