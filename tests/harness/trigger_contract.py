"""The trigger contract of docs/triggers.md as checks: the JSON Schema for the body, plus what
the schema cannot say (the tick key agrees with the job and the due instant, the headers
repeat the body). Tests of every reader (the Python SDK, the JavaScript example, CloudEvents
SDKs) run what they received through :func:`check_trigger`."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from hrwcron.core.ticks import format_ms
from hrwcron.engine.ports import HEADER_DUE, HEADER_JOB, HEADER_KIND, HEADER_MSG_ID

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_PATH = ROOT / "docs" / "schema" / "trigger-v1.json"
DOC_PATH = ROOT / "docs" / "triggers.md"


@cache
def validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA_PATH.read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def schema_errors(body: Any) -> list[str]:
    """Every way ``body`` (decoded JSON) breaks the schema; empty when it conforms."""
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator().iter_errors(body)]


def check_trigger(data: bytes | str, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The body of one trigger, decoded, after asserting that it conforms to the schema and
    to the rules beside it; with ``headers``, that they agree with the body."""
    body = json.loads(data)
    errors = schema_errors(body)
    assert not errors, f"trigger body breaks docs/schema/trigger-v1.json: {errors}: {body}"
    job, tick, kind = body["job"], body["tick"], body["kind"]
    assert tick.startswith(f"{job}:"), body
    assert body["due"] == format_ms(body["due_ms"]), body
    if kind in ("scheduled", "backfill"):
        assert tick == f"{job}:{body['due_ms']}", body
    else:
        assert tick.startswith(f"{job}:manual:"), body
    if headers is not None:
        assert headers[HEADER_MSG_ID] == tick, headers
        assert headers[HEADER_JOB] == job, headers
        assert headers[HEADER_DUE] == body["due"], headers
        assert headers[HEADER_KIND] == kind, headers
    return body  # type: ignore[no-any-return]
