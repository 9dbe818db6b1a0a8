"""How the CLI writes: lines and tables for people, the API's reply as JSON for scripts."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def emit(lines: Sequence[str]) -> None:
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    sys.stdout.flush()


def print_json(reply: Any) -> None:
    sys.stdout.write(msgspec.json.format(msgspec.json.encode(reply), indent=2).decode() + "\n")
    sys.stdout.flush()


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return lines


def short(instant: str | None) -> str:
    return "-" if not instant else instant.replace(".000Z", "Z")


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def format_instant(epoch_ms: int) -> str:
    """UTC ISO-8601 with ``Z``; milliseconds only when there are any."""
    base = (_EPOCH + timedelta(seconds=epoch_ms // 1000)).strftime("%Y-%m-%dT%H:%M:%S")
    ms = epoch_ms % 1000
    return f"{base}.{ms:03d}Z" if ms else f"{base}Z"
