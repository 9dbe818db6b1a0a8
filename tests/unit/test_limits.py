"""Every limit a valid-looking job spec could cross on its way to nats-server is checked before
anything is written: subject length and tokens, schedule length, ``@every`` range, payload
nesting, time zones, trigger size. Each refusal names its field and changes nothing."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from harness.admin_calls import call, refusal
from harness.serving import serving
from hrwcron.adapters.memory import MemoryJobs
from hrwcron.admin.api import (
    REQUEST_TYPES,
    RequestProblem,
    decode_request,
)
from hrwcron.core.config import ConfigFileError, config_warnings, parse_config
from hrwcron.core.errors import NatsSetupError, ScheduleError
from hrwcron.core.model import (
    MAX_PAYLOAD_DEPTH,
    MAX_SUBJECT_LENGTH,
    MAX_SUBJECT_TOKENS,
    TRIGGER_ENVELOPE,
    JobSpec,
    decode_job,
    json_depth,
)
from hrwcron.core.schedule import MAX_EVERY_MS, MAX_EXPRESSION_LENGTH, Schedule
from hrwcron.core.ticks import format_ms
from hrwcron.process.app import check_max_payload

PREFIX = "hrwcron.trigger"


def problems_at(spec: JobSpec, **kwargs: Any) -> dict[str, str]:
    return {p.where: p.message for p in spec.problems(**kwargs)}


def job(**fields: Any) -> JobSpec:
    return JobSpec(**{"name": "j", "schedule": "@every 1s", **fields})


def nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


# --- subjects ---------------------------------------------------------------------------


def test_the_subject_of_the_report_is_refused_by_length() -> None:
    subject = (PREFIX + "." + ".".join(["a" * 64] * 70))[:4_520]  # as in the report
    found = problems_at(job(subject=subject))
    assert list(found) == ["subject"]
    assert f"at most {MAX_SUBJECT_LENGTH}" in found["subject"]


def test_a_subject_at_the_limits_is_accepted_and_one_beyond_is_refused() -> None:
    tokens = ["t"] * (MAX_SUBJECT_TOKENS - 2)  # plus the prefix's two
    assert problems_at(job(subject=".".join([PREFIX, *tokens]))) == {}
    found = problems_at(job(subject=".".join([PREFIX, *tokens, "t"])))
    assert list(found) == ["subject"] and f"at most {MAX_SUBJECT_TOKENS}" in found["subject"]

    rest = MAX_SUBJECT_LENGTH - len(PREFIX) - 1
    parts = ["x" * 64] * (rest // 65) + ["x" * (rest % 65 - 1)]
    longest = ".".join([PREFIX, *parts])
    assert len(longest) == MAX_SUBJECT_LENGTH - 1
    assert problems_at(job(subject=longest + "y")) == {}
    found = problems_at(job(subject=longest + "yz"))
    assert list(found) == ["subject"] and "is 1025 characters long" in found["subject"]


def test_every_valid_job_name_gives_a_default_subject_within_the_limits() -> None:
    name = ".".join(["n" * 64] * 8)
    prefix = ".".join(["p" * 31] * 8)  # the longest prefix a config accepts (255 characters)
    spec = JobSpec(name=name, schedule="@every 1s")
    assert spec.problems(prefix=prefix) == []
    subject = spec.trigger_subject(prefix)
    assert len(subject) <= MAX_SUBJECT_LENGTH
    assert subject.count(".") + 1 <= MAX_SUBJECT_TOKENS


def test_a_config_refuses_a_subject_prefix_that_would_make_subjects_too_long() -> None:
    long_prefix = ".".join(["p"] * 9)
    with pytest.raises(ConfigFileError) as refused:
        parse_config(f'[scheduler]\nsubject_prefix = "{long_prefix}"\n', "c.toml", {})
    assert [p.where for p in refused.value.problems] == ["scheduler.subject_prefix"]


# --- schedules ----------------------------------------------------------------------------


def test_a_schedule_longer_than_the_limit_is_refused_without_parsing_it() -> None:
    huge = "0 " * 200_000 + "*"  # the report's 400,007 characters, give or take
    found = problems_at(job(schedule=huge))
    assert list(found) == ["schedule"]
    assert f"at most {MAX_EXPRESSION_LENGTH}" in found["schedule"]
    # A long but valid expression (every value of every field listed) is accepted.
    seconds = ",".join(str(s) for s in range(60))
    longest = f"{seconds} {seconds} * * * *"
    assert len(longest) < MAX_EXPRESSION_LENGTH
    assert problems_at(job(schedule=longest)) == {}
    padded = longest + " " * (MAX_EXPRESSION_LENGTH - len(longest))
    assert problems_at(job(schedule=padded)) == {}
    assert list(problems_at(job(schedule=padded + " "))) == ["schedule"]


@pytest.mark.parametrize("every", ["100000000000000h", "70000000h", "8785h", "31622400001ms"])
def test_every_beyond_a_year_is_refused(every: str) -> None:
    found = problems_at(job(schedule=f"@every {every}"))
    assert list(found) == ["schedule"] and "366 days" in found["schedule"]
    with pytest.raises(ScheduleError):
        Schedule.parse(f"@every {every}")


def test_every_at_its_longest_ticks_within_the_supported_years_from_any_instant() -> None:
    assert MAX_EVERY_MS == 31_622_400_000
    schedule = Schedule.parse("@every 8784h")
    for start in (-5_364_662_400_000, 0, 1_796_000_000_000, 221_845_392_000_000 - 1):
        due = schedule.next_after(start)
        assert start < due <= start + MAX_EVERY_MS
        format_ms(due)  # the year fits: status and the CLI can show it


# --- payloads -----------------------------------------------------------------------------


def test_payload_nesting_is_refused_past_the_limit() -> None:
    assert json_depth(nested(0)) == 0 and json_depth({"a": [1, {"b": []}]}) == 4
    assert problems_at(job(payload=nested(MAX_PAYLOAD_DEPTH))) == {}
    found = problems_at(job(payload=nested(MAX_PAYLOAD_DEPTH + 1)))
    assert list(found) == ["payload"] and f"more than {MAX_PAYLOAD_DEPTH}" in found["payload"]
    found = problems_at(job(payload=nested(983)))  # stored and fired before, then unreadable
    assert list(found) == ["payload"]


@pytest.mark.parametrize("depth", [983, 997, 5_000, 100_000])
def test_deep_request_bodies_are_refused_as_bad_requests(depth: int) -> None:
    body = b'{"spec": {"name": "deep", "schedule": "@every 1s", "payload": '
    body += b"[" * depth + b"]" * depth + b"}}"
    try:
        request = decode_request(body, REQUEST_TYPES["jobs.put"])
    except RequestProblem as exc:
        assert "levels deep" in exc.message and exc.field == "spec.payload"
    else:
        assert list(problems_at(request.spec)) == ["payload"]


def test_a_deep_value_in_the_jobs_bucket_is_a_job_error() -> None:
    data = b'{"name": "deep", "schedule": "@every 1s", "payload": ' + b"[" * 100_000
    data += b"]" * 100_000 + b"}"
    with pytest.raises(Exception) as raised:
        decode_job(data, where="deep")
    assert type(raised.value).__name__ == "JobSpecError"
    assert "levels deep" in str(raised.value)


# --- zones --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tz",
    ["localtime", "posix/Europe/Berlin", "right/UTC", "Factory", "posixrules", "/etc/localtime"],
)
def test_zones_that_depend_on_the_host_are_refused(tz: str) -> None:
    found = problems_at(job(tz=tz))
    assert list(found) == ["tz"] and "IANA time zone" in found["tz"]


@pytest.mark.parametrize(
    "tz", ["UTC", "Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "EST5EDT",
           "Etc/GMT+5", "US/Eastern", "Pacific/Chatham"]
)  # fmt: skip
def test_canonical_zones_and_their_links_keep_working(tz: str) -> None:
    assert problems_at(job(tz=tz, schedule="30 2 * * *")) == {}


def test_a_bad_zone_still_gets_its_schedule_checked() -> None:
    assert set(problems_at(job(tz="localtime", schedule="61 * * * *"))) == {"tz", "schedule"}


# --- trigger size ---------------------------------------------------------------------------


def test_a_max_payload_that_does_not_fit_the_server_is_refused_at_start() -> None:
    check_max_payload(64 * 1024, 1024 * 1024)
    check_max_payload(1024 * 1024 - TRIGGER_ENVELOPE, 1024 * 1024)
    with pytest.raises(NatsSetupError, match=r"lower scheduler\.max_payload to at most 1040384"):
        check_max_payload(1024 * 1024, 1024 * 1024)
    with pytest.raises(NatsSetupError):
        check_max_payload(64 * 1024, 64 * 1024)


# --- admin replies and errors ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"subject": PREFIX + "." + ".".join(["a" * 64] * 70)}, "spec.subject"),
        ({"schedule": "@every 100000000000000h"}, "spec.schedule"),
        ({"schedule": "@every 70000000h", "catchup": "latest"}, "spec.schedule"),
        ({"schedule": "0 " * 200_000 + "*"}, "spec.schedule"),
        ({"payload": "DEEP"}, "spec.payload"),
        ({"tz": "localtime"}, "spec.tz"),
        ({"tz": "right/UTC"}, "spec.tz"),
    ],
)
def test_the_admin_api_refuses_each_reported_spec_naming_the_field(
    fields: dict[str, Any], field: str
) -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        spec = {"name": "poison", "schedule": "@every 1s", **fields}
        # Nested too deeply for a test to encode: spliced into the request as text.
        body = msgspec.json.encode({"spec": spec}).replace(b'"DEEP"', b"[" * 983 + b"]" * 983)
        async with serving(jobs) as svc:
            req = await call(svc, "jobs.put", body)
        status, body = refusal(req)
        assert (status, body.code, body.field) == ("400", "bad_request", field)
        assert await jobs.snapshot() == {}

    asyncio.run(scenario())


def test_a_payload_whose_trigger_would_not_fit_the_server_is_refused() -> None:
    async def scenario() -> None:
        jobs = MemoryJobs()
        spec = {"name": "big", "schedule": "@every 1s", "payload": "x" * (30 * 1024)}
        async with serving(jobs, max_payload=32 * 1024) as svc:
            status, body = refusal(await call(svc, "jobs.put", {"spec": spec}))
        assert (status, body.field) == ("400", "spec.payload")
        assert "max_payload (32768 bytes)" in body.message
        assert await jobs.snapshot() == {}

    asyncio.run(scenario())


def test_check_config_warns_of_a_max_payload_the_default_server_cannot_carry() -> None:
    fits = parse_config("[scheduler]\nmax_payload = 1040384\n", "c.toml", {})
    assert config_warnings(fits) == []
    too_big = parse_config("[scheduler]\nmax_payload = 1048576\n", "c.toml", {})
    (warning,) = config_warnings(too_big)
    assert warning.where == "scheduler.max_payload" and "refuses to start" in warning.message
