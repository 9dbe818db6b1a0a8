"""Hostile input, generated: job specs, config files and variables, admin requests and trigger
messages. Whatever arrives, nothing but the documented error type escapes, every rejection names
the field it is about, and a refused write leaves the store as it was."""

from __future__ import annotations

import asyncio
import json
import re
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st

from harness.admin_calls import AdminRequest
from harness.serving import serving
from hrwcron.adapters.jetstream.triggers import _last
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.admin.api import REQUEST_TYPES, ErrorReply, RequestProblem, decode_request
from hrwcron.core.config import ConfigFileError, parse_config
from hrwcron.core.errors import JobSpecError, Problem
from hrwcron.core.model import DEFAULT_MAX_PAYLOAD, JobSpec, TriggerMessage, decode_job
from hrwcron.engine.ports import HEADER_MSG_ID, HEADER_WATERMARK

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

JOB_FIELDS = {f.name for f in msgspec.structs.fields(JobSpec)}
GOOD_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}(\.[A-Za-z0-9_-]{1,64}){0,7}")
# Characters that would make a job's trigger subject a wildcard, add or split tokens, or break
# the NATS protocol line the subject travels in.
SUBJECT_BREAKERS = ("*", ">", " ", "\t", "\r", "\n", "\x00", "..")

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
token = st.from_regex(r"[A-Za-z0-9_-]{1,12}", fullmatch=True)
good_names = st.lists(token, min_size=1, max_size=3).map(".".join)
hostile_names = st.one_of(
    st.text(max_size=40),
    st.tuples(good_names, st.sampled_from(SUBJECT_BREAKERS), good_names).map("".join),
    st.sampled_from(
        [
            "",
            ".",
            "a.",
            ".a",
            "*",
            ">",
            "a.*",
            "a.>",
            "a.b.*.c",
            "a b",
            "a\r\nPUB x 1\r\n",
            "ä",
            "a" * 65,
            ".".join(["a"] * 9),
        ]
    ),
)
schedules = st.one_of(
    st.sampled_from(
        ["@every 1s", "*/5 * * * *", "0 0 * * *", "*/2 * * * * *", "@hourly", "@every 0s"]
    ),
    st.text(max_size=30),
)
numbers = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.integers(-10, 100_000),
    st.text(max_size=5),
)


GOOD_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "tz": st.sampled_from(["UTC", "Europe/Paris", "America/New_York"]),
    "payload": json_values,
    "max_lateness": st.floats(0.5, 600),
    "jitter": st.floats(0, 10),
    "catchup": st.sampled_from(["all", "latest"]),
    "paused": st.booleans(),
    "tags": st.lists(token, max_size=2),
    "overlap": st.sampled_from(["allow", "skip"]),
    "description": st.text(max_size=20),
}
HOSTILE_FIELDS: dict[str, st.SearchStrategy[Any]] = {
    "tz": st.sampled_from(["Nope/Zone", "", "../../etc/passwd"]) | st.text(max_size=20),
    "payload": st.text(min_size=1).map(lambda s: s * 20_000) | json_values,
    "max_lateness": numbers,
    "jitter": numbers,
    "catchup": st.sampled_from(["some", ""]) | json_values,
    "paused": json_values,
    "subject": st.one_of(
        st.none(), st.just("hrwcron.trigger.x"), hostile_names, st.text(max_size=20)
    ),
    "tags": st.lists(st.text(max_size=10), max_size=3) | json_values,
    "overlap": st.sampled_from(["never"]) | json_values,
    "description": st.just("d" * 1025),
    "v": st.integers(0, 3),
    "unexpected": json_values,
}


@st.composite
def job_documents(draw: st.DrawFn) -> dict[str, Any]:
    """A JSON object shaped like a job spec: a valid one with a few fields made hostile (wrong
    type, wildcard, oversized, unknown), from none to all of them."""
    hostility = draw(st.sampled_from([0, 1, 1, 2, 5]))
    doc: dict[str, Any] = {
        "name": draw(good_names),
        "schedule": draw(st.sampled_from(["@every 1s", "*/5 * * * *", "0 0 * * *", "@hourly"])),
    }
    for key, strategy in GOOD_FIELDS.items():
        if draw(st.booleans()):
            doc[key] = draw(strategy)
    fields = ["name", "schedule", *HOSTILE_FIELDS]
    for key in draw(st.lists(st.sampled_from(fields), max_size=hostility, unique=True)):
        if key == "name":
            doc["name"] = draw(st.one_of(hostile_names, json_values))
        elif key == "schedule":
            if draw(st.booleans()):
                del doc["schedule"]
            else:
                doc["schedule"] = draw(st.one_of(schedules, json_values))
        else:
            doc[key] = draw(HOSTILE_FIELDS[key])
    return doc


def _field_of(problem: Problem) -> str:
    return re.split(r"[.\[]", problem.where, maxsplit=1)[0]


@FAST
@given(job_documents())
@example({"name": "a.*", "schedule": "@every 1s"})
@example({"name": "a.b", "schedule": "@every 1s", "payload": "x" * (DEFAULT_MAX_PAYLOAD + 1)})
def test_a_stored_job_is_either_valid_or_refused_with_its_problems_named(
    doc: dict[str, Any],
) -> None:
    data = msgspec.json.encode(doc)
    try:
        spec = decode_job(data, where="jobs/key")
    except JobSpecError as exc:
        assert exc.problems and all(p.message for p in exc.problems)
        assert exc.problems[0].where == "jobs/key"
        return
    found = spec.problems()
    assert all(isinstance(p, Problem) and p.message for p in found)
    assert {_field_of(p) for p in found} <= JOB_FIELDS
    if isinstance(spec.name, str) and any(b in spec.name for b in SUBJECT_BREAKERS):
        assert "name" in {p.where for p in found}
    if found:
        return
    # Accepted: the trigger subject is the prefix plus the name's own tokens, nothing more.
    assert GOOD_NAME.fullmatch(spec.name)
    subject = spec.trigger_subject()
    assert not set(subject) & set("*> \t\r\n\x00")
    if spec.subject is None:
        assert subject.split(".")[2:] == spec.name.split(".")
    assert len(msgspec.json.encode(spec.payload)) <= DEFAULT_MAX_PAYLOAD


@FAST
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_bytes_in_the_jobs_bucket_never_raise_anything_but_a_job_error(data: bytes) -> None:
    try:
        spec = decode_job(data, where="k")
    except JobSpecError as exc:
        assert exc.problems[0].where == "k" and exc.problems[0].message
    else:
        spec.problems()


@given(hostile_names)
@FAST
def test_wildcard_and_token_injecting_names_are_refused(name: str) -> None:
    assume(not GOOD_NAME.fullmatch(name))
    found = JobSpec(name=name, schedule="@every 1s").problems()
    assert [p.where for p in found] == ["name"]
    assert "token" in found[0].message or "empty" in found[0].message


@given(st.integers(1, 4096), st.integers(0, 8192))
@FAST
def test_a_payload_over_the_limit_is_refused_by_size(limit: int, size: int) -> None:
    spec = JobSpec(name="big", schedule="@every 1s", payload="x" * size)
    found = spec.problems(max_payload=limit)
    encoded = size + 2  # the JSON string's quotes
    if encoded > limit:
        assert found == [
            Problem("payload", f"is {encoded} bytes as JSON; the limit is {limit} bytes")
        ]
    else:
        assert found == []


# --- config files and variables --------------------------------------------------------------

SECRET = "hunter2-Zq9xW"
toml_keys = st.sampled_from(
    [
        "servers",
        "user",
        "password",
        "token",
        "node_id",
        "member_ttl",
        "heartbeat_interval",
        "listen",
        "log_level",
        "replicas",
        "max_payload",
        "tags",
        "name",
        "schedule",
        "bogus",
    ]
) | st.text(min_size=1, max_size=8)
toml_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["90s", "5m", "-1s", "nats://u:pw@h:4222", "tls://h:1"]),
)
toml_values = toml_scalars | st.lists(toml_scalars, max_size=3)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return _toml_string(str(value))


def _toml_string(text: str) -> str:
    escaped = "".join(
        f"\\u{ord(ch):04x}" if ch < " " or ch == "\x7f" else "\\" + ch if ch in '"\\' else ch
        for ch in text
    )
    return f'"{escaped}"'


GOOD_SETTINGS: dict[str, dict[str, Any]] = {
    "nats": {"servers": ["nats://127.0.0.1:4222"], "connect_timeout": "2s", "name": "x"},
    "scheduler": {"node_id": "n1", "member_ttl": 3, "heartbeat_interval": "1s", "tags": ["a"]},
    "http": {"listen": "127.0.0.1:9464"},
    "telemetry": {"log_level": "debug", "log_format": "json"},
    "jobs": {"name": "j", "schedule": "@every 5s", "max_lateness": "30s"},
}


@st.composite
def config_texts(draw: st.DrawFn) -> str:
    """A TOML file: good settings of each section, some replaced or joined by hostile keys and
    values, and sometimes a line that is not TOML at all."""
    hostility = draw(st.sampled_from([0, 1, 2, 4]))
    lines: list[str] = []
    sections = draw(st.lists(st.sampled_from([*GOOD_SETTINGS, "extra"]), unique=True))
    for section in sections + ["jobs"] * draw(st.integers(0, 2)):
        table = dict(GOOD_SETTINGS.get(section, {}))
        if section == "jobs":
            table["name"] = f"j{len(lines)}"
        extra = draw(st.dictionaries(toml_keys, toml_values, max_size=hostility))
        table.update(extra)
        lines.append("[[jobs]]" if section == "jobs" else f"[{section}]")
        lines.extend(f"{_toml_string(key)} = {_toml(value)}" for key, value in table.items())
    if hostility and not draw(st.integers(0, 4)):
        lines.insert(0, draw(st.text(max_size=30)))
    return "\n".join(lines)


env_names = st.sampled_from(
    [
        "HRWCRON_NATS_URL",
        "HRWCRON_NATS_PASSWORD",
        "HRWCRON_NATS_TOKEN",
        "HRWCRON_NATS_USER",
        "HRWCRON_NODE_ID",
        "HRWCRON_SCHEDULER_MEMBER_TTL",
        "HRWCRON_SCHEDULER_REPLICAS",
        "HRWCRON_HTTP_LISTEN",
        "HRWCRON_SCHEDULER_TAGS",
        "HRWCRON_TYPO",
    ]
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    config_texts(),
    st.dictionaries(env_names, st.text(max_size=20), max_size=3),
    st.sampled_from(["password", "token", "url"]),
)
def test_a_config_is_loaded_or_refused_with_every_problem_located_and_no_secret_shown(
    text: str, env: dict[str, str], secret_at: str
) -> None:
    # The secret is also planted through the channel most likely to leak: an environment
    # variable whose value is shown when it does not parse.
    if secret_at == "url":
        env = {**env, "HRWCRON_NATS_URL": f"nats://user:{SECRET}@127.0.0.1:4222"}
    else:
        env = {**env, f"HRWCRON_NATS_{secret_at.upper()}": SECRET}
    try:
        config = parse_config(text, "fuzz.toml", env)
    except ConfigFileError as exc:
        assert exc.problems
        for problem in exc.problems:
            assert problem.message
        for line in exc.lines():
            assert line.startswith(("fuzz.toml:", "environment:"))
        assert SECRET not in str(exc)
        assert SECRET not in repr(exc.problems)
        return
    assert SECRET not in repr(config)
    assert SECRET not in repr(config.nats)
    assert SECRET not in json.dumps(config.redacted())


# --- admin requests ---------------------------------------------------------------------------


# The job verbs that answer from the store alone (pause and resume wait for the engine).
STORE_VERBS = ("jobs.put", "jobs.get", "jobs.delete", "jobs.list")
requests = st.one_of(
    st.binary(max_size=60),
    st.builds(lambda spec, rev: {"spec": spec, "revision": rev}, job_documents(), json_values),
    st.builds(lambda spec: {"spec": spec}, job_documents()),
    st.builds(lambda name: {"name": name}, st.just("existing") | good_names | hostile_names),
    st.dictionaries(
        st.sampled_from(["name", "revision", "prefix", "after", "limit", "spec", "x"]),
        json_values | hostile_names,
        max_size=3,
    ),
)


def _body(request: Any) -> bytes:
    return request if isinstance(request, bytes) else msgspec.json.encode(request)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(STORE_VERBS), requests)
@example("jobs.put", {"spec": {"name": "a.*", "schedule": "@every 1s"}})
@example("jobs.list", b"[1]")
@example("jobs.put", {"spec": {"name": "big", "schedule": "@every 1s", "payload": "x" * 70_000}})
def test_an_admin_request_is_served_or_refused_by_name_and_a_refusal_writes_nothing(
    verb: str, request: Any
) -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        await jobs.put(JobSpec(name="existing", schedule="@every 1s"), None)
        before = await jobs.snapshot()
        async with serving(jobs) as service:
            handler = service._handlers[verb]
            endpoint = service._endpoint(verb, handler)
            req = AdminRequest(_body(request))
            await endpoint(req)  # type: ignore[arg-type]
        after = await jobs.snapshot()
        if req.error is not None:
            status, description, data = req.error
            body = msgspec.json.decode(data, type=ErrorReply).error
            assert body.code != "internal" and status != "500", description
            assert description and body.message
            if body.code == "bad_request":
                # Located at a field, unless the body as a whole is wrong.
                whole = ("request body is not JSON", "Expected `object`")
                assert body.field or body.problems or body.message.startswith(whole), body
            assert after == before, "a refused request changed the jobs bucket"
            return
        assert req.reply is not None
        if verb == "jobs.put":
            name = msgspec.json.decode(req.reply)["name"]
            stored = after[name].spec
            assert stored is not None and stored.problems() == []
        elif verb in ("jobs.get", "jobs.list"):
            assert after == before

    asyncio.run(scenario())


@FAST
@given(st.sampled_from(sorted(REQUEST_TYPES)), st.binary(max_size=80) | json_values.map(_body))
def test_every_admin_request_body_decodes_or_names_its_problem(verb: str, data: bytes) -> None:
    try:
        decode_request(data, REQUEST_TYPES[verb])
    except RequestProblem as exc:
        assert exc.message
        if data.strip() and data.strip()[:1] == b"{" and "not JSON" not in exc.message:
            assert exc.field or "Expected `object`" in exc.message or "`" in exc.message


# --- trigger messages -------------------------------------------------------------------------


@FAST
@given(
    st.integers(0, 2**63),
    st.none()
    | st.dictionaries(
        st.sampled_from([HEADER_MSG_ID, HEADER_WATERMARK, "Hrwcron-Job", "x"]) | st.text(),
        st.text(max_size=30) | st.integers(-(2**70), 2**70).map(str),
        max_size=4,
    ),
)
def test_any_headers_on_a_trigger_subject_read_as_a_last_trigger(
    seq: int, headers: dict[str, str] | None
) -> None:
    last = _last(seq, headers)
    assert last.seq == seq and isinstance(last.watermark, int) and isinstance(last.msg_id, str)


@FAST
@given(st.binary(max_size=200) | json_values.map(_body))
def test_a_trigger_body_decodes_or_fails_with_a_decode_error(data: bytes) -> None:
    try:
        message = msgspec.json.decode(data, type=TriggerMessage)
    except msgspec.MsgspecError as exc:
        assert str(exc)
    else:
        assert isinstance(message.due_ms, int)


@pytest.mark.parametrize("name", ["a.*", "a.>", "a b", "a..b", "a\r\nPUB evil 1", "*", ">"])
def test_the_admin_api_refuses_subject_injecting_names_before_writing(name: str) -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        req = AdminRequest(msgspec.json.encode({"spec": {"name": name, "schedule": "@every 1s"}}))
        async with serving(jobs) as service:
            await service._endpoint("jobs.put", service._handlers["jobs.put"])(req)  # type: ignore[arg-type]
        assert req.error is not None
        body = msgspec.json.decode(req.error[2], type=ErrorReply).error
        assert (body.code, body.field) == ("bad_request", "spec.name")
        assert await jobs.snapshot() == {}

    asyncio.run(scenario())
