"""The items of a ``jobs.bulk`` request as the client encodes them, and how a bulk write is cut
into requests that fit one message."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from hrwcron.admin.api import (
    MAX_BULK,
    JobOutcome,
    ProblemBody,
)
from hrwcron.core.model import JobSpec


def put_item(spec: JobSpec, revision: int | None) -> bytes:
    """One item of a ``jobs.bulk`` request's ``jobs``, as JSON."""
    item: dict[str, Any] = {"spec": spec}
    if revision is not None:
        item["revision"] = revision
    return msgspec.json.encode(item)


def delete_item(name: str, revision: int | None) -> bytes:
    item: dict[str, Any] = {"name": name}
    if revision is not None:
        item["revision"] = revision
    return msgspec.json.encode(item)


def oversized(items: Sequence[bytes], budget: int) -> list[tuple[int, int]]:
    return [(i, len(item)) for i, item in enumerate(items) if len(item) + 1 > budget]


def chunks(items: Sequence[bytes], indexes: Sequence[int], budget: int) -> list[list[int]]:
    """``indexes`` in order, cut into runs whose items (and a comma each) fit ``budget``."""
    found: list[list[int]] = []
    current: list[int] = []
    used = 0
    for index in indexes:
        size = len(items[index]) + 1
        if current and (used + size > budget or len(current) >= MAX_BULK):
            found.append(current)
            current, used = [], 0
        current.append(index)
        used += size
    if current:
        found.append(current)
    return found


def too_big(name: str, size: int, max_payload: int) -> JobOutcome:
    message = (
        f"the spec is {size} bytes as JSON; with a request around it that is more than the "
        f"NATS server's max_payload ({max_payload} bytes)"
    )
    return JobOutcome(
        name=name, outcome="refused", problems=[ProblemBody(field="", message=message)]
    )
