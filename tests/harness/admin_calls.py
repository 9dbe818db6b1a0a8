"""Calling an admin verb handler in process, as a request on an inbox would, and reading its
refusal: for the unit tests of the admin service."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import msgspec

from hrwcron.admin import service as admin_service
from hrwcron.admin.api import ErrorBody, ErrorReply

__all__ = ["AdminRequest", "call", "refusal"]


class AdminRequest:
    """A request as the micro service hands it to a handler, recording the answer."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        # The message behind it: replicas answer only on an inbox.
        self._msg = SimpleNamespace(reply="_INBOX.test")
        self.reply: bytes | None = None
        self.error: tuple[str, str, bytes] | None = None

    async def respond(self, data: bytes) -> None:
        self.reply = data

    async def respond_error(self, code: str, description: str, data: bytes = b"") -> None:
        self.error = (code, description, data)


async def call(svc: admin_service.AdminService, verb: str, request: Any) -> AdminRequest:
    req = AdminRequest(request if isinstance(request, bytes) else msgspec.json.encode(request))
    await svc._endpoint(verb, svc._handlers[verb])(req)  # type: ignore[arg-type]
    return req


def refusal(req: AdminRequest) -> tuple[str, ErrorBody]:
    assert req.error is not None, req.reply
    return req.error[0], msgspec.json.decode(req.error[2], type=ErrorReply).error
