"""Wire and storage records (msgspec Structs), each with a schema version, and their rules."""

from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Any, Literal
from zoneinfo import available_timezones

import msgspec

from hrwcron.core.errors import JobSpecError, Problem, ScheduleError
from hrwcron.core.plan import Allowance, TickPlan
from hrwcron.core.resources import SUBJECT_PREFIX

SCHEMA_VERSION = 1
DEFAULT_MAX_PAYLOAD = 64 * 1024
HRW_SCHEME = "xxh3-64"

_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TAG = re.compile(r"[A-Za-z0-9_.:=-]{1,64}")
MAX_JOB_TOKENS = 8
JOB_NAME_RULE = (
    "a job name is 1-8 dot-separated tokens of letters, digits, '_' or '-', "
    "each 1-64 characters (no wildcards, spaces or empty tokens)"
)

# A trigger subject travels in the PUB line of every publish, next to the reply inbox and the
# sizes; nats-server closes a connection whose line passes max_control_line (4096 bytes by
# default). These bounds keep that line, and every KV key built from a subject or a job name,
# far below it: a job name is at most 8 tokens of 64 characters (519 in all).
MAX_SUBJECT_LENGTH = 1024
MAX_SUBJECT_TOKENS = 32
# Arrays and objects nested in a payload. Every decoder on the way (the admin API, the jobs
# watch, each worker) recurses per level, and Python's stack runs out near 1000 levels, at a
# depth that depends on where the decoder is called from; a fixed, low bound keeps every one of
# them far from it.
MAX_PAYLOAD_DEPTH = 64
# What a trigger carries besides the job's payload: the body's other fields (job name, tick
# key, instants, node id) and the headers (Msg-Id, job, due, kind, watermark, fencing sequence,
# trace context), with every field at its longest and room to spare. ``scheduler.max_payload``
# plus this must fit the server's max_payload.
TRIGGER_ENVELOPE = 8 * 1024

Catchup = Literal["all", "latest"]
Overlap = Literal["allow", "skip"]


def job_name_problem(name: object) -> str | None:
    """Why ``name`` is not a valid job name, or None when it is."""
    if not isinstance(name, str) or not name:
        return f"must not be empty; {JOB_NAME_RULE}"
    tokens = name.split(".")
    if len(tokens) > MAX_JOB_TOKENS:
        return f"{name[:80]!r} has {len(tokens)} tokens; {JOB_NAME_RULE}"
    for token in tokens:
        if not _TOKEN.fullmatch(token):
            return f"{name[:80]!r} has the bad token {token[:80]!r}; {JOB_NAME_RULE}"
    return None


def tag_problem(tag: object) -> str | None:
    """Why ``tag`` is not a valid tag, or None when it is."""
    if isinstance(tag, str) and _TAG.fullmatch(tag):
        return None
    return "a tag is 1-64 of letters, digits, _ . : = -"


def subject_problem(subject: str, prefix: str) -> str | None:
    shown = repr(subject[:80]) + ("..." if len(subject) > 80 else "")
    if len(subject) > MAX_SUBJECT_LENGTH:
        return (
            f"{shown} is {len(subject)} characters long; a trigger subject is at most "
            f"{MAX_SUBJECT_LENGTH}"
        )
    if not subject.startswith(prefix + "."):
        return f"{shown} is outside the trigger stream's subjects {prefix}.>"
    tokens = subject.count(".") + 1
    if tokens > MAX_SUBJECT_TOKENS:
        return f"{shown} has {tokens} tokens; a trigger subject has at most {MAX_SUBJECT_TOKENS}"
    rest = subject[len(prefix) + 1 :]
    for token in rest.split("."):
        if not _TOKEN.fullmatch(token):
            return f"{shown} has the bad token {token[:80]!r} (no wildcards or empty tokens)"
    return None


# Names that load on some hosts only, or differently on each: the host's own zone, the
# "posix/" and "right/" (leap second) copies of the database, and tzdata's placeholder zone.
_HOST_ZONES = frozenset({"localtime", "posixrules", "Factory"})


@lru_cache(maxsize=1)
def _iana_zones() -> frozenset[str]:
    """The zone names of the IANA database shipped with hrwcron (the tzdata package), so every
    replica accepts the same names whatever its host has in /usr/share/zoneinfo."""
    try:
        names = resources.files("tzdata").joinpath("zones").read_text("utf-8").split()
    except (ModuleNotFoundError, OSError):
        names = list(available_timezones())
    return frozenset(names) - _HOST_ZONES


def tz_problem(tz: str) -> str | None:
    """Why ``tz`` is not a canonical IANA zone name every replica reads the same way."""
    if isinstance(tz, str) and tz in _iana_zones():
        return None
    shown = repr(tz[:80]) if isinstance(tz, str) else type(tz).__name__
    return (
        f"{shown} is not an IANA time zone name such as 'UTC' or 'Europe/Berlin' "
        "('localtime', 'posix/...', 'right/...' and 'Factory' depend on the host)"
    )


def json_depth(value: Any, limit: int = MAX_PAYLOAD_DEPTH) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar is 0, ``[]`` is 1), counted
    without recursion and only up to ``limit + 1``."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Any = item.values()
        elif isinstance(item, list | tuple):
            children = item
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


# A job's lateness window when it names none. The trigger stream's duplicate window must cover
# it, or a late publish of such a job could land after its Msg-Id was forgotten.
DEFAULT_MAX_LATENESS = 60.0


class JobSpec(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """One schedule. Durations are seconds."""

    name: str
    schedule: str
    tz: str = "UTC"
    payload: Any = None
    max_lateness: float = DEFAULT_MAX_LATENESS
    catchup: Catchup = "all"
    jitter: float = 0.0
    paused: bool = False
    subject: str | None = None
    tags: list[str] = msgspec.field(default_factory=list)
    overlap: Overlap = "allow"
    description: str = ""
    # When ticks happen at all (see plan.py): RFC 3339 instants, both ends included, and
    # cron expressions or local date ranges whose ticks are skipped.
    start: str | None = None
    end: str | None = None
    exclude: list[str] = msgspec.field(default_factory=list)
    # Scheduled triggers the job fires in all; the count is shared state (see core/run_limits.py).
    max_runs: int | None = None
    # Seconds after a job has no ticks left (its @at passed, its end passed, its runs are
    # used up) until one replica deletes it.
    delete_after: float | None = None
    v: int = SCHEMA_VERSION

    def plan(self, tz: str | None = None) -> TickPlan:
        """The job's ticks: its schedule inside its window, with its exclusions (in ``tz``
        instead of the job's zone when given)."""
        return TickPlan.parse(
            self.schedule,
            tz or self.tz,
            job=self.name,
            start=self.start,
            end=self.end,
            exclude=self.exclude,
        )

    def _ticks(self) -> tuple[object, ...]:
        return (self.name, self.schedule, self.tz, self.start, self.end, self.exclude)

    def never_fires_problem(self, before: JobSpec | None, now_ms: int) -> Problem | None:
        """For a write made now (the admin API): why a new job, or one whose ticks change,
        would never fire from now on (an @at or end in the past, exclusions that leave
        nothing). An edit that leaves the ticks alone, such as a finished one-time job's
        description, is not refused for being finished."""
        if before is not None and before._ticks() == self._ticks():
            return None
        try:
            return self.plan().never_fires_problem(now_ms)
        except ScheduleError:
            return None  # reported by problems()

    @property
    def finite(self) -> bool:
        """Whether the job can run out of ticks (so that ``delete_after`` means something)."""
        return self.end is not None or self.max_runs is not None or _one_time(self.schedule)

    def trigger_subject(self, prefix: str = SUBJECT_PREFIX) -> str:
        return self.subject or f"{prefix}.{self.name}"

    @property
    def max_lateness_ms(self) -> int:
        return int(self.max_lateness * 1000)

    def problems(
        self,
        *,
        prefix: str = SUBJECT_PREFIX,
        max_payload: int = DEFAULT_MAX_PAYLOAD,
        check_schedule: bool = True,
        now_ms: int | None = None,
        allowance: Allowance | None = None,
    ) -> list[Problem]:
        """Every rule this spec breaks (empty when valid). With ``now_ms`` (a write made now,
        through the admin API) also a job that would never fire from now on: an ``@at`` or an
        ``end`` in the past, exclusions that leave no tick. Without it only what holds at any
        time, so a config file that loaded once keeps loading."""
        found: list[Problem] = []
        bad_name = job_name_problem(self.name)
        if bad_name:
            found.append(Problem("name", bad_name))
        if self.v != SCHEMA_VERSION:
            found.append(Problem("v", f"schema version {self.v} is not supported (expected 1)"))
        bad_tz = tz_problem(self.tz)
        if bad_tz:
            found.append(Problem("tz", bad_tz))
        if check_schedule:
            # With a bad zone the expression is still worth checking, in a good one.
            found += self._plan_problems(now_ms, "UTC" if bad_tz else self.tz, allowance)
        if not (0 < self.max_lateness <= 86_400):
            found.append(Problem("max_lateness", "must be more than 0 and at most 86400 seconds"))
        if not (0 <= self.jitter <= 3_600):
            found.append(Problem("jitter", "must be between 0 and 3600 seconds"))
        if self.subject is not None:
            bad = subject_problem(self.subject, prefix)
            if bad:
                found.append(Problem("subject", bad))
        for i, tag in enumerate(self.tags):
            bad_tag = tag_problem(tag)
            if bad_tag:
                found.append(Problem(f"tags[{i}]", bad_tag))
        if len(self.description) > 1024:
            found.append(Problem("description", "at most 1024 characters"))
        depth = json_depth(self.payload)
        if depth > MAX_PAYLOAD_DEPTH:
            found.append(
                Problem(
                    "payload",
                    f"nests arrays and objects more than {MAX_PAYLOAD_DEPTH} levels deep",
                )
            )
            return found
        try:
            size = len(msgspec.json.encode(self.payload))
        except (TypeError, msgspec.EncodeError, RecursionError) as exc:
            found.append(Problem("payload", f"is not JSON: {exc}"))
        else:
            if size > max_payload:
                found.append(
                    Problem("payload", f"is {size} bytes as JSON; the limit is {max_payload} bytes")
                )
        if self.max_runs is not None and not (1 <= self.max_runs <= MAX_RUNS):
            found.append(Problem("max_runs", f"must be from 1 to {MAX_RUNS}"))
        if self.delete_after is not None:
            if not (0 < self.delete_after <= MAX_DELETE_AFTER):
                found.append(
                    Problem(
                        "delete_after",
                        f"must be more than 0 and at most {MAX_DELETE_AFTER:g} seconds (10 years)",
                    )
                )
            elif not self.finite:
                found.append(
                    Problem(
                        "delete_after",
                        "applies to jobs that run out of ticks: give an @at schedule, an end "
                        "or max_runs",
                    )
                )
        return found

    def _plan_problems(
        self, now_ms: int | None, tz: str, allowance: Allowance | None
    ) -> list[Problem]:
        try:
            plan = self.plan(tz)
        except ScheduleError as exc:
            return [_located(p) for p in exc.problems]
        late = None if plan.plain else plan.static_problem(allowance)
        if late is None and now_ms is not None:
            late = plan.never_fires_problem(now_ms, allowance)
        return [] if late is None else [late]

    def validate(self, **kwargs: Any) -> JobSpec:
        found = self.problems(**kwargs)
        if found:
            raise JobSpecError(found)
        return self


MAX_RUNS = 1_000_000_000
MAX_DELETE_AFTER = 10 * 366 * 86_400.0
_PLAN_FIELDS = ("tz", "start", "end")


def _located(problem: Problem) -> Problem:
    """A plan problem under the spec field it is about: the window's own fields as they are,
    the schedule's (``minute``, ``@at``, ...) under ``schedule``."""
    where = problem.where
    if where in _PLAN_FIELDS or where.startswith("exclude["):
        return problem
    return Problem("schedule", f"{where}: {problem.message}" if where else problem.message)


def _one_time(expr: str) -> bool:
    return expr.strip().lower().startswith("@at")


class TriggerMessage(msgspec.Struct, kw_only=True):
    """The body of a trigger published to ``hrwcron.trigger.<job>``."""

    job: str
    tick: str
    due: str
    due_ms: int
    fired_at: str
    node: str
    attempt: int
    payload: Any = None
    kind: Literal["scheduled", "manual", "backfill"] = "scheduled"
    v: int = SCHEMA_VERSION


class Heartbeat(msgspec.Struct, kw_only=True):
    """What a replica writes into the members bucket every heartbeat."""

    node: str
    instance: str
    started_ms: int
    version: str
    hrw: str = HRW_SCHEME
    weight: float = 1.0
    tags: list[str] = msgspec.field(default_factory=list)
    digest: str = ""
    jobs: int = 0
    ready: bool = True
    reason: str = ""
    http: str = ""
    # The NATS server's clock minus this replica's, as it estimates it: known only to itself,
    # announced so that every member's console can show it.
    offset_ms: float = 0.0
    v: int = SCHEMA_VERSION


class ClaimRecord(msgspec.Struct, kw_only=True):
    """The value of a tick's create-only claim key."""

    node: str
    instance: str
    attempt: int
    claimed_ms: int
    # "skipped" when the holder decided not to fire (overlap = "skip"): the tick is resolved.
    outcome: str = ""
    v: int = SCHEMA_VERSION


def encode(obj: Any) -> bytes:
    return msgspec.json.encode(obj)


def decode_job(data: bytes, *, where: str = "job") -> JobSpec:
    """Decode a stored job spec; raises JobSpecError naming the problem."""
    try:
        return msgspec.json.decode(data, type=JobSpec)
    except msgspec.ValidationError as exc:
        raise JobSpecError(Problem(where, str(exc))) from None
    except msgspec.DecodeError as exc:
        raise JobSpecError(Problem(where, f"is not JSON: {exc}")) from None
    except RecursionError:
        raise JobSpecError(
            Problem(where, f"nests arrays and objects more than {MAX_PAYLOAD_DEPTH} levels deep")
        ) from None
