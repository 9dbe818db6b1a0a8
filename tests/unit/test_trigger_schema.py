"""Trigger bodies without a server: what ``trigger_writes`` builds for every kind of trigger
conforms to docs/schema/trigger-v1.json and the rules beside it, the worker SDK decodes the
same values, the schema refuses what no replica writes, and the page's example is a trigger."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from harness.engine_parts import DUE, flights
from harness.trigger_contract import DOC_PATH, check_trigger, schema_errors
from hrwcron.core.model import TriggerMessage
from hrwcron.engine.flight import trigger_writes


def test_every_kind_of_trigger_body_conforms_to_the_schema_and_the_sdk_reads_it_whole() -> None:
    for _, body, headers, _ in trigger_writes(flights(), "scheduler-1", DUE + 4):
        decoded = check_trigger(body, headers)
        # The worker SDK decodes what the schema describes, member for member.
        message = msgspec.json.decode(body, type=TriggerMessage)
        assert msgspec.to_builtins(message) == decoded


def test_the_schema_refuses_what_a_replica_never_writes_and_so_does_the_sdk() -> None:
    _, body, _, _ = trigger_writes(flights()[:1], "scheduler-1", DUE)[0]
    good = json.loads(body)
    assert schema_errors(good) == []
    wrong_types = {
        "due_ms": str(DUE),
        "attempt": "1",
        "job": 7,
        "tick": None,
        "kind": "cron",
        "node": ["a"],
    }
    for member, value in wrong_types.items():
        bad = {**good, member: value}
        assert schema_errors(bad), member
        with pytest.raises(msgspec.ValidationError):
            msgspec.json.decode(json.dumps(bad), type=TriggerMessage)
    # Stricter than the SDK, which reads leniently: shapes only a replica promises.
    promises = {
        "v": 2,
        "due": "2026-03-08T07:10:00Z",
        "tick": "reports.daily",
        "job": "reports..daily",
        "attempt": 0,
        "node": "a b",
    }
    for member, value in promises.items():
        assert schema_errors({**good, member: value}), member
    for member in good:
        missing = {k: v for k, v in good.items() if k != member}
        assert schema_errors(missing), member


def test_the_schema_lets_version_1_gain_members() -> None:
    _, body, _, _ = trigger_writes(flights()[:1], "scheduler-1", DUE)[0]
    assert schema_errors({**json.loads(body), "region": "eu"}) == []


def test_the_example_on_the_trigger_page_is_a_trigger() -> None:
    page = DOC_PATH.read_text()
    (example,) = re.findall(r"```json\n(.*?)```", page, re.DOTALL)
    check_trigger(example)
