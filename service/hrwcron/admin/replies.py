"""How the admin API says no, and how its replies stay within one message: the refusal type,
the helpers that build refusals, the page budget of listings, and the error reply cut to fit."""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Sequence
from typing import Any, TypeVar

import msgspec

from hrwcron.admin.api import (
    ErrorBody,
    ErrorReply,
    JobEntry,
    ProblemBody,
)
from hrwcron.core.errors import (
    Problem,
)
from hrwcron.core.model import job_name_problem
from hrwcron.engine.ports import (
    JobEvent,
)

# How long a request waits for this replica's watch to deliver a job the bucket already holds.
CATCH_UP_S = 3.0

# Room left in every reply for the micro service's own framing.
REPLY_RESERVE = 1024
# An error reply says what is wrong; it never needs to be longer than this.
MAX_ERROR_REPLY = 64 * 1024
MAX_ERROR_TEXT = 4096
# What to ask for instead when a reply cannot fit; the paged verbs never get there.
TOO_LARGE_HINTS = {
    "backfill": "; backfill a shorter range (from, to)",
    "jobs.bulk": "; send fewer jobs per request",
}


class ApiError(Exception):
    """A refused request: the reply carries ``code``, ``message`` and ``field``."""

    def __init__(
        self, code: str, message: str, field: str = "", problems: list[Problem] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.problems = problems or []

    def body(self) -> ErrorBody:
        return ErrorBody(
            code=self.code,
            message=self.message,
            field=self.field,
            problems=[ProblemBody(field=p.where, message=p.message) for p in self.problems],
        )


def bad(field: str, message: str) -> ApiError:
    return ApiError("bad_request", f"{field}: {message}" if field else message, field)


def check_name(name: str, field: str = "name") -> None:
    problem = job_name_problem(name)
    if problem:
        raise bad(field, problem)


def behind() -> ApiError:
    return ApiError(
        "unavailable",
        f"this replica is still loading job changes (more than {CATCH_UP_S:g} s behind the "
        "jobs bucket); retry",
    )


def prefix_range(names: Sequence[str], prefix: str) -> tuple[int, int]:
    """The slice of sorted ``names`` that start with ``prefix``."""
    if not prefix:
        return 0, len(names)
    low = bisect.bisect_left(names, prefix)
    return low, bisect.bisect_left(names, prefix + "\U0010ffff", low)


def subject_taken(subject: str, holder: str) -> str:
    return (
        f"{subject!r} is already the trigger subject of job {holder!r}; each job needs its "
        "own (fencing is per subject)"
    )


def stale(name: str, asked: int, stored: int) -> ApiError:
    return ApiError(
        "conflict",
        f"job {name!r} changed since revision {asked} (it is at revision {stored} now): "
        "read it again and retry",
        "revision",
    )


def epoch_ms(instant: Any) -> int:
    return int(instant.timestamp() * 1000)


def job_entry(event: JobEvent) -> JobEntry:
    return JobEntry(name=event.name, revision=event.revision, spec=event.spec, error=event.error)


def without_spec(entry: JobEntry, size: int) -> JobEntry:
    return JobEntry(
        name=entry.name,
        revision=entry.revision,
        error=f"the stored spec is {size} bytes, more than fits in a reply: {entry.error[:200]}",
    )


# Room for a page's cursor: a job name is at most 519 characters, a sequence 20 digits.
CURSOR_ROOM = 600


class Page:
    """Counts the bytes of a reply while entries are added to it, so a page ends before the
    reply outgrows ``budget``. ``envelope`` is the reply without entries and cursor."""

    def __init__(self, budget: int, hard: int, envelope: msgspec.Struct) -> None:
        self.budget = budget
        self.hard = hard
        self.used = len(msgspec.json.encode(envelope)) + CURSOR_ROOM

    @staticmethod
    def size_of(entry: msgspec.Struct) -> int:
        return len(msgspec.json.encode(entry)) + 1  # and its comma

    def fits(self, entry: msgspec.Struct, *, first: bool = False) -> bool:
        """Takes ``entry`` if it fits the budget. The first entry of a page only has to fit
        one message, so a page always makes progress, even with a tiny ``max_bytes``."""
        size = self.size_of(entry)
        if self.used + size > (self.hard if first else self.budget):
            return False
        self.used += size
        return True


P = TypeVar("P")
E = TypeVar("E", bound=msgspec.Struct)


def merged_page(
    shares: Sequence[tuple[Sequence[tuple[P, str, E]], bool]], page: Page, limit: int
) -> tuple[list[E], str]:
    """One page from the members' pages of their shares: each a list of (position, cursor,
    entry) in page order and whether it stopped short. The page stops at the last position of
    a member that stopped short (so the next page misses nothing of it), at ``limit`` entries
    or when ``page`` is full. Returns the entries and the cursor of the next page, empty when
    this is the last."""
    ends = [items[-1][0] for items, short in shares if short and items]
    upto = min(ends) if ends else None  # type: ignore[type-var]
    entries: list[E] = []
    more = upto is not None
    last = ""
    for position, cursor, entry in heapq.merge(*(items for items, _ in shares), key=_position):
        if cursor == last:
            continue  # listed by two members while the members changed
        if (
            (upto is not None and position > upto)  # type: ignore[operator]
            or len(entries) == limit
            or not page.fits(entry, first=not entries)
        ):
            more = True
            break
        entries.append(entry)
        last = cursor
    return entries, last if more else ""


def _position(item: tuple[Any, str, Any]) -> Any:
    return item[0]


def error_reply(body: ErrorBody, limit: int) -> bytes:
    """The error reply, cut to ``limit`` bytes: long texts shortened, problems beyond what
    fits dropped with a note saying how many."""
    text = min(MAX_ERROR_TEXT, limit // 4)
    message, field = body.message[:text], body.field[:200]
    kept: list[ProblemBody] = []
    base = ErrorReply(error=ErrorBody(code=body.code, message=message, field=field))
    used = len(msgspec.json.encode(base)) + 100  # and the note on dropped problems
    for problem in body.problems:
        short = ProblemBody(field=problem.field[:200], message=problem.message[:text])
        size = len(msgspec.json.encode(short)) + 1
        if used + size > limit:
            break
        kept.append(short)
        used += size
    dropped = len(body.problems) - len(kept)
    if dropped:
        kept.append(ProblemBody(field="", message=f"... and {dropped} more problems"))
    trimmed = ErrorBody(code=body.code, message=message, field=field, problems=kept)
    return msgspec.json.encode(ErrorReply(error=trimmed))
