"""CloudEvents on triggers without a server: off, a trigger carries no ``ce-`` header; on,
``trigger_writes`` adds the binary-mode attributes of the NATS binding and a CloudEvents SDK
reads them back; the setting that turns them on, and the header value encoding the binding
asks for."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

import pytest
from cloudevents.core.bindings.http import HTTPMessage, from_binary_event

from harness.engine_parts import DUE, LONGEST_NAME, flights
from hrwcron.adapters.jetstream.pipeline import message_size
from hrwcron.core import events
from hrwcron.core.config import ConfigFileError, config_warnings, parse_config
from hrwcron.core.model import TRIGGER_ENVELOPE
from hrwcron.core.ticks import format_ms
from hrwcron.engine.flight import cloudevents_headers, trigger_writes
from hrwcron.process.app import settings


def headers_of(writes: list[tuple[str, bytes, dict[str, str], int]]) -> list[dict[str, str]]:
    return [headers for _, _, headers, _ in writes]


def parse(text: str, env: dict[str, str] | None = None) -> Any:
    return parse_config(text, "test.toml", env or {})


# ----------------------------------------------------------------------------- CloudEvents


def test_with_cloudevents_off_a_trigger_carries_no_ce_header() -> None:
    for headers in headers_of(trigger_writes(flights(), "n", DUE)):
        assert not [k for k in headers if k.lower().startswith("ce-")], headers
        assert "content-type" not in {k.lower() for k in headers}
    assert cloudevents_headers("") is None


def test_with_cloudevents_on_each_trigger_is_a_binary_mode_event() -> None:
    ce = cloudevents_headers("/hrwcron/hrwcron.trigger")
    plain = trigger_writes(flights(), "n", DUE)
    for (_, body, with_ce, _), (_, _, without, _) in zip(
        trigger_writes(flights(), "n", DUE, ce), plain, strict=True
    ):
        decoded = json.loads(body)
        added = {k: v for k, v in with_ce.items() if k not in without}
        assert added == {
            "ce-specversion": "1.0",
            "ce-id": decoded["tick"],
            "ce-source": "/hrwcron/hrwcron.trigger",
            "ce-type": "io.hrwcron.tick",
            "ce-time": decoded["due"],
            "ce-subject": decoded["job"],
            "ce-datacontenttype": "application/json",
            "content-type": "application/json",
        }
        assert {k: with_ce[k] for k in without} == without  # nothing else changes
        event = from_binary_event(HTTPMessage(headers=with_ce, body=body))
        assert event.get_id() == decoded["tick"]
        assert event.get_time().timestamp() * 1000 == decoded["due_ms"]
        assert event.get_data() == decoded


def test_a_source_is_sent_percent_encoded_and_read_back_as_written() -> None:
    source = "https://cron.example.com/eu%20west?deployment=prod#a"
    ce = cloudevents_headers(source)
    assert ce is not None
    assert ce["ce-source"] == "https://cron.example.com/eu%2520west?deployment=prod#a"
    _, body, headers, _ = trigger_writes(flights()[:1], "n", DUE, ce)[0]
    assert from_binary_event(HTTPMessage(headers=headers, body=body)).get_source() == source


@pytest.mark.parametrize(
    "text",
    ["plain", "with space", 'a "quote"', "100%", "Euro € 😀", "tab\there", "~!*'();:@&=+$,/?#[]"],
)
def test_header_values_encode_as_the_nats_binding_says(text: str) -> None:
    encoded = events.header_value(text)
    assert re.fullmatch(r"[!-~]*", encoded) and '"' not in encoded, encoded
    assert unquote(encoded, errors="strict") == text
    if re.fullmatch(r"[!-~]*", text) and not set(text) & set('"%'):
        assert encoded == text  # nothing is escaped that need not be
    assert events.header_value("Euro € 😀") == "Euro%20%E2%82%AC%20%F0%9F%98%80"


def test_a_trigger_with_cloudevents_at_its_longest_fits_the_room_kept_for_the_envelope() -> None:
    source = "/" + "%41" * 84 + "x" * 2  # 255 characters, each escape sent as five
    assert events.source_problem(source) is None and len(source) == events.MAX_SOURCE
    ce = cloudevents_headers(source)
    longest = flights()[-1]
    longest.kind, longest.msg_id = "manual", f"{LONGEST_NAME}:manual:{'i' * 64}"
    longest.run, longest.watermark = 2**63, -(2**63)
    _, body, headers, _ = trigger_writes([longest], "n" * 64, 221_845_391_999_999, ce)[0]
    headers["Nats-Expected-Last-Subject-Sequence"] = str(2**64)
    headers["traceparent"] = "00-" + "f" * 32 + "-" + "f" * 16 + "-01"
    headers["tracestate"] = "x" * 512
    assert message_size(body, headers) - len(b"null") < TRIGGER_ENVELOPE


def test_due_and_time_are_the_same_instant_as_due_ms() -> None:
    ce = cloudevents_headers("/s")
    for _, body, headers, _ in trigger_writes(flights(), "n", DUE, ce):
        decoded = json.loads(body)
        assert headers["ce-time"] == format_ms(decoded["due_ms"]) == decoded["due"]


# ----------------------------------------------------------------------------- the setting


def test_cloudevents_are_off_unless_a_deployment_turns_them_on() -> None:
    default = parse("")
    assert default.scheduler.cloudevents is False
    assert default.scheduler.events_source == ""
    assert settings(default).cloudevents_source == ""
    on = parse("[scheduler]\ncloudevents = true\n")
    assert on.scheduler.events_source == "/hrwcron/hrwcron.trigger"
    assert settings(on).cloudevents_source == "/hrwcron/hrwcron.trigger"
    prefixed = parse('[scheduler]\ncloudevents = true\nsubject_prefix = "acme.cron"\n')
    assert prefixed.scheduler.events_source == "/hrwcron/acme.cron"
    from_env = parse(
        "",
        {
            "HRWCRON_SCHEDULER_CLOUDEVENTS": "true",
            "HRWCRON_SCHEDULER_CLOUDEVENTS_SOURCE": "urn:acme:cron:prod",
        },
    )
    assert settings(from_env).cloudevents_source == "urn:acme:cron:prod"


@pytest.mark.parametrize(
    "source",
    ["has space", "a%zz", 'a"b', "caf\u00e9", "x" * 256, "<tag>", "back\\slash"],
)
def test_a_source_that_is_no_uri_reference_is_refused_by_name(source: str) -> None:
    with pytest.raises(ConfigFileError) as info:
        parse(f"[scheduler]\ncloudevents = true\ncloudevents_source = {json.dumps(source)}\n")
    assert [p.where for p in info.value.problems] == ["scheduler.cloudevents_source"]


def test_a_source_without_cloudevents_is_a_warning() -> None:
    config = parse('[scheduler]\ncloudevents_source = "https://cron.example.com"\n')
    assert config.scheduler.events_source == ""
    assert [p.where for p in config_warnings(config)] == ["scheduler.cloudevents_source"]
    assert config_warnings(parse("")) == []
