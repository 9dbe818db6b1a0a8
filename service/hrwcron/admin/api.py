"""The admin API's wire format: subjects, request and reply structs, and structured errors.

Shared by the service (every replica) and the client (the CLI), so both sides decode exactly
the same shapes. Requests refuse unknown fields: a misspelt option must not be ignored.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from hrwcron.core.model import MAX_PAYLOAD_DEPTH, JobSpec

ADMIN_PREFIX = "hrwcron.admin"
SERVICE_NAME = "hrwcron"
QUEUE_GROUP = "hrwcron-admin"

MAX_LIST = 10_000
MAX_HISTORY = 1_000
MAX_BACKFILL = 1_000
MAX_STATUS = 10_000
MAX_BULK = 10_000

# Every verb, in the order the service registers them; subjects are <prefix>.<verb>.
VERBS = (
    "jobs.list",
    "jobs.get",
    "jobs.put",
    "jobs.bulk",
    "jobs.delete",
    "jobs.pause",
    "jobs.resume",
    "trigger",
    "backfill",
    "status",
    "history",
)

# Error codes, each with the number micro services put in the Nats-Service-Error-Code header.
ERROR_CODES = {
    "bad_request": "400",
    "not_found": "404",
    "conflict": "409",
    "too_large": "413",
    "unavailable": "503",
    "internal": "500",
}
# Codes a caller fixes by changing its request (the CLI exits 2); the rest are server trouble.
CALLER_ERRORS = frozenset({"bad_request", "not_found", "conflict", "too_large"})

_MANUAL_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
MANUAL_ID_RULE = "1-64 letters, digits, '_' or '-'"

Limit = Annotated[int, msgspec.Meta(ge=1)]
# A reply's size in bytes: 0 means as much as one reply can carry (the server's max_payload).
# Lists, status and history stop a page at whichever of ``limit`` and ``max_bytes`` comes first
# and say where the next page starts.
MaxBytes = Annotated[int, msgspec.Meta(ge=0)]
Revision = Annotated[int, msgspec.Meta(ge=0)]
Instant = Annotated[datetime, msgspec.Meta(tz=True)]


def subject(verb: str, prefix: str = ADMIN_PREFIX) -> str:
    return f"{prefix}.{verb}"


def manual_id_problem(value: str) -> str | None:
    """Why ``value`` cannot be a manual trigger id: it is one token of the tick key and of
    the claim key (see :func:`hrwcron.core.ticks.claim_key`)."""
    if not _MANUAL_ID.fullmatch(value):
        return f"{value[:80]!r} is not a valid trigger id; {MANUAL_ID_RULE}"
    return None


class _Request(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


# --- errors -------------------------------------------------------------------------------


class ProblemBody(msgspec.Struct, kw_only=True):
    field: str
    message: str


class ErrorBody(msgspec.Struct, kw_only=True):
    code: str
    message: str
    field: str = ""
    problems: list[ProblemBody] = msgspec.field(default_factory=list)


class ErrorReply(msgspec.Struct, kw_only=True):
    error: ErrorBody


# --- jobs ---------------------------------------------------------------------------------


class ListJobs(_Request):
    prefix: str = ""
    after: str = ""  # page cursor: only names sorting after this one
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_LIST)] = 1_000
    max_bytes: MaxBytes = 0
    # Between replicas that hold shares: only the jobs of the lanes the answering replica
    # lists (those it is the first live holder of), for the replica that merges the pages.
    share: bool = False


class JobEntry(msgspec.Struct, kw_only=True):
    name: str
    revision: int
    spec: JobSpec | None = None
    # Set when the stored value is not a valid job, or too large for a reply (spec left out).
    error: str = ""


class JobList(msgspec.Struct, kw_only=True):
    jobs: list[JobEntry]
    next: str = ""  # pass as ``after`` for the next page; empty on the last page
    total: int = 0  # jobs matching ``prefix``, on every page together


class GetJob(_Request):
    name: str


class PutJob(_Request):
    spec: JobSpec
    # None: write whatever is stored; 0: only if the job does not exist; N: only if the stored
    # revision is still N (compare-and-set).
    revision: Revision | None = None


class PutResult(msgspec.Struct, kw_only=True):
    name: str
    revision: int
    created: bool


class BulkPut(_Request):
    """One job of a ``jobs.bulk`` request: the same fields as ``jobs.put``."""

    spec: JobSpec
    revision: Revision | None = None


class BulkDelete(_Request):
    name: str
    revision: Annotated[int, msgspec.Meta(ge=1)] | None = None


class PutJobs(_Request):
    """Many job writes and deletions in one request. Each item is decoded and validated on
    its own, so a bad one is refused alone; with ``atomic`` any refusal writes nothing; with
    ``dry_run`` nothing is written and every answer says what a write would do."""

    jobs: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_BULK)] = msgspec.field(
        default_factory=list
    )
    delete: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_BULK)] = msgspec.field(
        default_factory=list
    )
    atomic: bool = False
    dry_run: bool = False


# What happened to one job of a bulk request (or, with dry_run, what would).
BulkOutcome = Literal[
    "created",  # written, new
    "updated",  # written over a stored one
    "unchanged",  # the stored spec is this one already: nothing written
    "deleted",
    "absent",  # to delete, but there is no such job: nothing to do
    "refused",  # invalid, or its subject is another job's: see problems
    "conflict",  # the job is not at the revision asked for, or changed while written
    "skipped",  # valid, but not written because the request is atomic and others failed
    "failed",  # NATS did not confirm the write: it may or may not have happened; retry
]


class JobOutcome(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str
    outcome: BulkOutcome
    revision: int = 0  # the job's revision after the write (or as found, when unchanged)
    problems: list[ProblemBody] = msgspec.field(default_factory=list)


class BulkResult(msgspec.Struct, kw_only=True):
    jobs: list[JobOutcome]  # one per item of ``jobs``, in request order
    deleted: list[JobOutcome]  # one per item of ``delete``, in request order
    dry_run: bool = False


class DeleteJob(_Request):
    name: str
    revision: Annotated[int, msgspec.Meta(ge=1)] | None = None


class DeleteResult(msgspec.Struct, kw_only=True):
    name: str
    deleted: bool = True


class PauseJob(_Request):
    """For ``jobs.pause`` and ``jobs.resume``."""

    name: str
    revision: Annotated[int, msgspec.Meta(ge=1)] | None = None


class PauseResult(msgspec.Struct, kw_only=True):
    name: str
    revision: int
    paused: bool
    changed: bool


# --- firing -------------------------------------------------------------------------------


class TriggerJob(_Request):
    name: str
    id: str = ""  # makes the request idempotent; generated when empty


class TriggerResult(msgspec.Struct, kw_only=True):
    name: str
    tick: str
    outcome: str  # "started" or "duplicate" (this id was fired before)
    due: str
    node: str


class BackfillJob(_Request):
    name: str
    start: Instant = msgspec.field(name="from")
    end: Instant = msgspec.field(name="to")
    dry_run: bool = False


class BackfillResult(msgspec.Struct, kw_only=True):
    name: str
    due: int  # due instants in the range
    published: list[str]  # tick keys published now (or, with dry_run, that would be)
    present: list[str]  # already in the stream or claimed: not published again
    left_to_scheduler: list[str]  # inside the job's lateness window: the scheduler fires them
    dry_run: bool = False


# --- reading ------------------------------------------------------------------------------


class StatusRequest(_Request):
    name: str = ""  # one job only
    prefix: str = ""
    # "name": jobs by name; "due": soonest next firing first, paused and finished jobs last.
    order: Literal["name", "due"] = "name"
    after: str = ""  # page cursor: the ``next`` of the previous page
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_STATUS)] = 1_000
    max_bytes: MaxBytes = 0
    # Between replicas that hold shares: the summary and jobs of the lanes the answering
    # replica lists, with each job's cursor, for the replica that merges the pages.
    share: bool = False


class MemberStatus(msgspec.Struct, kw_only=True):
    node: str
    age_s: float  # since this replica last saw the member's heartbeat change
    live: bool
    ready: bool
    reason: str
    weight: float
    tags: list[str]
    digest: str
    digest_matches: bool
    version: str
    jobs: int
    started: str


class LastTriggerStatus(msgspec.Struct, kw_only=True):
    seq: int
    tick: str


class JobStatus(msgspec.Struct, kw_only=True):
    name: str
    schedule: str
    tz: str
    paused: bool
    tags: list[str]
    overlap: str
    subject: str
    revision: int
    owner: str | None
    order: list[str]  # owner first, then the failover candidates
    next_due: str | None  # nominal due instant of the next tick that fires (None: none left)
    next_fire: str | None  # next_due plus the job's jitter
    last: LastTriggerStatus | None
    # paused | waiting (for its start) | active | done (one-time passed, runs used up) | ended
    state: str = "active"
    runs_done: int | None = None  # with max_runs: scheduled triggers fired so far
    runs_left: int | None = None
    # Why the job's last tick could not be fired (e.g. the server refused its trigger).
    problem: str = ""


class StatusSummary(msgspec.Struct, kw_only=True):
    """The whole job set in a few numbers, as the answering replica sees it: small enough
    for one reply at any number of jobs."""

    jobs: int = 0  # loaded and running (paused ones included)
    paused: int = 0
    bad: int = 0  # stored specs not loaded, and jobs whose last trigger the server refused
    owned: dict[str, int] = msgspec.field(default_factory=dict)  # jobs per owner
    no_owner: int = 0  # jobs no live member is eligible for (tags)
    missed_last_hour: int = 0  # ticks that passed their lateness window unpublished


class StatusReply(msgspec.Struct, kw_only=True):
    node: str  # the replica that answered
    ready: bool
    reason: str
    digest: str
    members: list[MemberStatus]
    jobs: list[JobStatus]
    total_jobs: int  # jobs matching name or prefix, on every page together
    truncated: bool  # more pages follow
    next: str = ""  # pass as ``after`` for the next page; empty on the last page
    summary: StatusSummary = msgspec.field(default_factory=StatusSummary)
    # Of a share's reply only (see StatusRequest.share): each job's cursor, in page order.
    cursors: list[str] = msgspec.field(default_factory=list)


class HistoryRequest(_Request):
    name: str
    limit: Annotated[int, msgspec.Meta(ge=1, le=MAX_HISTORY)] = 20
    before: Annotated[int, msgspec.Meta(ge=0)] = 0  # page cursor: only older stream sequences
    max_bytes: MaxBytes = 0


class HistoryEntry(msgspec.Struct, kw_only=True):
    seq: int
    tick: str
    kind: str
    due: str
    fired_at: str
    stored: str
    node: str
    attempt: int
    payload: Any = None
    omitted: str = ""  # why ``payload`` was left out (too large for a reply)


class HistoryReply(msgspec.Struct, kw_only=True):
    name: str
    subject: str
    triggers: list[HistoryEntry]  # newest first
    next: int = 0  # pass as ``before`` for older triggers; 0 when there are none


REQUEST_TYPES: dict[str, type[_Request]] = {
    "jobs.list": ListJobs,
    "jobs.get": GetJob,
    "jobs.put": PutJob,
    "jobs.bulk": PutJobs,
    "jobs.delete": DeleteJob,
    "jobs.pause": PauseJob,
    "jobs.resume": PauseJob,
    "trigger": TriggerJob,
    "backfill": BackfillJob,
    "status": StatusRequest,
    "history": HistoryRequest,
}

# What each verb answers (a request sent on to another replica comes back as this).
REPLY_TYPES: dict[str, type[msgspec.Struct]] = {
    "jobs.list": JobList,
    "jobs.get": JobEntry,
    "jobs.put": PutResult,
    "jobs.bulk": BulkResult,
    "jobs.delete": DeleteResult,
    "jobs.pause": PauseResult,
    "jobs.resume": PauseResult,
    "trigger": TriggerResult,
    "backfill": BackfillResult,
    "status": StatusReply,
    "history": HistoryReply,
}

R = TypeVar("R", bound=msgspec.Struct)

_AT = re.compile(r" - at `\$\.?([^`]*)`$")
_NAMED = re.compile(r"(?:unknown|missing required) field `([^`]*)`")


class RequestProblem(Exception):
    """A request body that does not decode into its struct."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}" if field else message)
        self.field = field
        self.message = message


def decode_request(data: bytes, request_type: type[R]) -> R:
    """``data`` as ``request_type``; an empty body is ``{}``. Raises RequestProblem naming the
    offending field."""
    try:
        return msgspec.json.decode(data or b"{}", type=request_type)
    except msgspec.ValidationError as exc:
        text = str(exc)
        at = _AT.search(text)
        where = at.group(1) if at else ""
        message = text[: at.start()] if at else text
        named = _NAMED.search(message)
        if named:
            # The struct's own field is more useful than the object that lacks or has it.
            where = f"{where}.{named.group(1)}" if where else named.group(1)
        raise RequestProblem(where, message) from None
    except msgspec.DecodeError as exc:
        raise RequestProblem("", f"request body is not JSON: {exc}") from None
    except RecursionError:
        # Deeper than any valid request. A job's payload is the only untyped field, so the
        # only one that can nest this far before a type check stops the decoder.
        where = "spec.payload" if "spec" in request_type.__struct_fields__ else ""
        raise RequestProblem(
            where, f"nests arrays and objects more than {MAX_PAYLOAD_DEPTH} levels deep"
        ) from None
