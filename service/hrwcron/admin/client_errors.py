"""How the admin client reads a refusal: :class:`AdminError`, made from an error reply, and
the answer a bulk item gets when its whole request failed."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from hrwcron.admin.api import (
    ErrorReply,
    JobOutcome,
    ProblemBody,
)
from hrwcron.core.errors import HrwcronError

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


class Refused(Exception):
    """An error reply: the replica answered, so the request reached it and was turned down."""

    def __init__(self, error: AdminError) -> None:
        super().__init__(error.message)
        self.error = error


def unanswered(name: str, error: AdminError) -> JobOutcome:
    """The answer for a job whose request failed as a whole."""
    if error.code in ("bad_request", "too_large"):
        return JobOutcome(
            name=name,
            outcome="refused",
            problems=[ProblemBody(field=error.field, message=error.message)],
        )
    message = f"{error.message} (it may or may not have been written)"
    return JobOutcome(
        name=name, outcome="failed", problems=[ProblemBody(field="", message=message)]
    )


def error_from_reply(data: bytes, headers: dict[str, str]) -> AdminError:
    try:
        body = msgspec.json.decode(data, type=ErrorReply).error
    except msgspec.MsgspecError:
        code = headers.get(ERROR_CODE_HEADER, "")
        message = headers.get("Nats-Service-Error", "") or f"error {code}"
        return AdminError("internal" if code == "500" else "unavailable", message)
    return AdminError(
        body.code, body.message, body.field, [(p.field, p.message) for p in body.problems]
    )
