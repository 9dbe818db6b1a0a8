"""One exception hierarchy for everything hrwcron raises on purpose.

Callers catch :class:`HrwcronError` to handle any expected failure; everything else is a bug.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


class HrwcronError(Exception):
    """Root of every error hrwcron raises deliberately."""


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input: where it is and why it is wrong."""

    where: str
    message: str

    def __str__(self) -> str:
        return f"{self.where}: {self.message}" if self.where else self.message


class InvalidInput(HrwcronError):
    """Bad input from a user: carries every problem found, so all can be reported at once."""

    def __init__(self, problems: Sequence[Problem] | Problem | str, where: str = "") -> None:
        if isinstance(problems, str):
            problems = [Problem(where, problems)]
        elif isinstance(problems, Problem):
            problems = [problems]
        self.problems: list[Problem] = list(problems)
        super().__init__("; ".join(str(p) for p in self.problems))

    @property
    def field(self) -> str:
        return self.problems[0].where if self.problems else ""

    @classmethod
    def collect(cls, errors: Iterable[InvalidInput]) -> InvalidInput | None:
        problems = [p for e in errors for p in e.problems]
        return cls(problems) if problems else None


class ScheduleError(InvalidInput):
    """A cron expression, duration or time zone that cannot be used."""


class JobSpecError(InvalidInput):
    """A job specification that breaks a rule (name, payload size, subject, ...)."""


class ConfigError(InvalidInput):
    """A configuration file or environment variable that cannot be used."""


class ImportSourceError(InvalidInput):
    """A crontab or Kubernetes manifest that cannot become job specs as it is: every problem
    names its file and line, and all of them are reported at once."""


class NatsSetupError(HrwcronError):
    """The NATS server or its streams cannot serve hrwcron as configured."""


class ServerVersionError(NatsSetupError):
    """The NATS server is older than the minimum version hrwcron needs."""


class StreamConfigError(NatsSetupError):
    """An existing stream or bucket contradicts what hrwcron needs; says what to change."""


class DuplicateNodeError(HrwcronError):
    """Another live replica already uses this node id."""


class StoreError(HrwcronError):
    """A store behind one of the engine's ports failed a request (engine/ports.py): the
    server refused or did not answer, whatever the input."""


class ConflictError(HrwcronError):
    """A compare-and-set write lost: somebody changed the value since it was read."""


class SubjectTakenError(ConflictError):
    """Another job already publishes on the trigger subject a job asked for."""

    def __init__(self, subject: str, holder: str) -> None:
        super().__init__(
            f"{subject!r} is already the trigger subject of job {holder!r}; each job needs its "
            "own (fencing is per subject)"
        )
        self.subject = subject
        self.holder = holder


class NotFoundError(HrwcronError):
    """The named job or record does not exist."""


class SearchExhausted(HrwcronError):
    """A bounded search over a schedule spent its steps before it could tell whether another
    tick fires (see :data:`hrwcron.core.plan.SEARCH_BUDGET`)."""
