"""The ``hrwcron`` command line: next, owner, check-config, and the exit-code contract."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import xxhash

from hrwcron import __version__
from hrwcron.cli import format_instant, main
from hrwcron.core.hrw import rank, weighted_rank

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "hrwcron.toml"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def assert_usage_error(code: int, out: list[str], err: str, *needles: str) -> None:
    assert code == 2
    assert out == []
    for needle in needles:
        assert needle in err


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("HRWCRON_"):
            monkeypatch.delenv(name)


# The DST policy's examples (docs/schedules.md), plus the 30-minute (Lord Howe) and
# 45-minute (Chatham) zones.
DST_CASES = [
    # fixed-time in the spring-forward gap: once, as the gap ends (03:00 EDT)
    (
        "30 2 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        2,
        ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"],
    ),
    # fixed-time in the repeated hour: first pass only (01:30 EDT), then 01:30 EST next day
    (
        "30 1 * * *",
        "America/New_York",
        "2026-10-31T12:00:00Z",
        2,
        ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
    ),
    # interval-like through the repeated hour: every 15 real minutes, both passes
    (
        "*/15 * * * *",
        "America/New_York",
        "2026-11-01T04:50:00Z",
        9,
        [f"2026-11-01T{h:02d}:{m:02d}:00Z" for h in (5, 6) for m in (0, 15, 30, 45)]
        + ["2026-11-01T07:00:00Z"],
    ),
    # interval-like across the gap: skips the nonexistent 02:xx, no burst at 03:00
    (
        "*/15 * * * *",
        "America/New_York",
        "2026-03-08T06:40:00Z",
        3,
        ["2026-03-08T06:45:00Z", "2026-03-08T07:00:00Z", "2026-03-08T07:15:00Z"],
    ),
    # 02:00 is skipped and 03:00 lands on the same instant: one tick
    (
        "0 2,3 * * *",
        "America/New_York",
        "2026-03-07T12:00:00Z",
        3,
        ["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z", "2026-03-09T07:00:00Z"],
    ),
    # Lord Howe springs forward 30 minutes (02:00 -> 02:30 local): 02:15 fires at 02:30
    (
        "15 2 * * *",
        "Australia/Lord_Howe",
        "2026-10-02T12:00:00Z",
        2,
        ["2026-10-02T15:45:00Z", "2026-10-03T15:30:00Z"],
    ),
    # Lord Howe falls back 30 minutes (02:00 -> 01:30 local): 01:45 fires on the first pass only
    (
        "45 1 * * *",
        "Australia/Lord_Howe",
        "2026-04-03T12:00:00Z",
        3,
        ["2026-04-03T14:45:00Z", "2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
    ),
    # Chatham (+12:45 -> +13:45) skips 02:45-03:45: 03:00 fires at 03:45 CHADT
    (
        "0 3 * * *",
        "Pacific/Chatham",
        "2026-09-25T12:00:00Z",
        2,
        ["2026-09-25T14:15:00Z", "2026-09-26T14:00:00Z"],
    ),
]


@pytest.mark.parametrize(("expr", "tz", "after", "count", "expected"), DST_CASES)
def test_next_follows_the_dst_policy(
    capsys: pytest.CaptureFixture[str],
    expr: str,
    tz: str,
    after: str,
    count: int,
    expected: list[str],
) -> None:
    code, out, err = run(capsys, "next", expr, "--tz", tz, "--after", after, "--count", str(count))
    assert (code, out, err) == (0, expected, "")


def test_next_design_example_verbatim(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["next", "30 2 * * *", "--tz", "America/New_York", "--after", "2026-03-07T12:00:00Z"]
    assert run(capsys, *[*argv, "--count", "1"])[1] == ["2026-03-08T07:00:00Z"]
    assert run(capsys, *argv)[1] == ["2026-03-08T07:00:00Z"]  # --count defaults to 1


def test_next_accepts_offsets_and_prints_millis_only_when_needed(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, _ = run(
        capsys,
        "next",
        "30 2 * * *",
        "--tz",
        "America/New_York",
        "--after",
        "2026-03-07T07:00:00-05:00",
    )
    assert (code, out) == (0, ["2026-03-08T07:00:00Z"])
    code, out, _ = run(
        capsys, "next", "@every 1500ms", "--after", "2026-01-01T00:00:00Z", "--count", "2"
    )
    assert (code, out) == (0, ["2026-01-01T00:00:01.500Z", "2026-01-01T00:00:03Z"])


# Forms that used to be refused, answered by `hrwcron next` as a new user would try them.
FORM_CASES = [
    ("0 0 L * *", ["2026-01-31T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-31T00:00:00Z"]),
    ("0 9 * * 1#2", ["2026-01-12T09:00:00Z", "2026-02-09T09:00:00Z", "2026-03-09T09:00:00Z"]),
    ("0 */30 * * *", ["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z", "2026-01-04T00:00:00Z"]),
    ("0 9 15W * *", ["2026-01-15T09:00:00Z", "2026-02-16T09:00:00Z", "2026-03-16T09:00:00Z"]),
    ("0 18 * * 5L", ["2026-01-30T18:00:00Z", "2026-02-27T18:00:00Z", "2026-03-27T18:00:00Z"]),
    ("0 12 ? * MON", ["2026-01-05T12:00:00Z", "2026-01-12T12:00:00Z", "2026-01-19T12:00:00Z"]),
]


@pytest.mark.parametrize(("expr", "expected"), FORM_CASES)
def test_next_answers_the_extended_forms(
    capsys: pytest.CaptureFixture[str], expr: str, expected: list[str]
) -> None:
    argv = ["next", expr, "--after", "2026-01-01T01:00:00Z", "--count", "3"]
    assert run(capsys, *argv) == (0, expected, "")


def test_next_hashes_H_from_the_job_named_by_job(capsys: pytest.CaptureFixture[str]) -> None:
    job = "reports.daily"
    minute = xxhash.xxh3_64_intdigest(job.encode() + b"\x00minute") % 60
    hour = xxhash.xxh3_64_intdigest(job.encode() + b"\x00hour") % 24
    argv = ["next", "H H * * *", "--job", job, "--after", "2026-01-01T23:59:00Z", "--count", "2"]
    expected = [f"2026-01-0{day}T{hour:02d}:{minute:02d}:00Z" for day in (2, 3)]
    assert run(capsys, *argv) == (0, expected, "")
    other = run(capsys, "next", "H H * * *", "--job", "billing.nightly", "--count", "2")[1]
    assert other != run(capsys, "next", "H H * * *", "--job", job, "--count", "2")[1]


def test_next_defaults_to_now(capsys: pytest.CaptureFixture[str]) -> None:
    before = datetime.now(UTC)
    code, out, _ = run(capsys, "next", "* * * * * *")  # every second
    after = datetime.now(UTC)
    assert code == 0
    (line,) = out
    assert before < datetime.fromisoformat(line) <= after + timedelta(seconds=1)


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["next", "30 2 * * *", "--after", "2026-03-07T12:00:00"], ["--after", "no UTC offset"]),
        (["next", "30 2 * * *", "--after", "yesterday"], ["--after", "ISO-8601"]),
        (["next", "30 2 * * *", "--count", "0"], ["--count"]),
        (["next", "30 2 * * *", "--count", "many"], ["--count"]),
        (["next", "61 * * * *"], ["hrwcron next: error:", "61"]),
        (["next", "H * * * *"], ["--job", "'H' in minute", "no job name was given"]),
        (["next", "H * * * *", "--job", "a b"], ["--job", "'a b'"]),
        (["next", "reports.daily", "--job", "x"], ["--job", "JOB already names the job"]),
        (["next", "0 0 31W 4 *"], ["day-of-month", "'31W'", "never fires"]),
        (["next", "0 9 * * 1#6"], ["day-of-week", "k is from 1 to 5"]),
        (["next", "0 */0 * * *"], ["hour", "step 0"]),
        (["next", "30 2 * * *", "--tz", "Mars/Olympus_Mons"], ["tz", "Mars/Olympus_Mons"]),
        (["next", "30 2 * * *", "--after", "1066-10-14T09:00:00Z"], ["hrwcron next: error:"]),
        (["next", "@at 2026-12-24"], ["@at", "no time of day"]),
        (["next", "0 * * * *", "--start", "2026-03-01T00:00:00"], ["--start", "no UTC offset"]),
        (
            ["next", "0 * * * *", "--start", "2026-03-02T00:00Z", "--end", "2026-03-01T00:00Z"],
            ["--end", "is before start"],
        ),
        (["next", "0 * * * *", "--exclude", "Easter"], ["--exclude", "'Easter' is not understood"]),
        (["next", "0 * * * *", "--exclude", "@every 1h"], ["--exclude", "@every"]),
        (["next", "reports.daily", "--start", "2026-03-01T00:00Z"], ["--start", "its own start"]),
        (["next", "reports.daily", "--exclude", "2026-12-25"], ["--exclude", "own exclusions"]),
        (["owner", "bad job!", "--nodes", "a,b"], ["JOB", "bad job!"]),
        (["owner", "j", "--nodes", "a,,b"], ["--nodes"]),
        (["owner", "j", "--nodes", "a,b,a"], ["'a' is listed twice"]),
        (["owner", "j", "--nodes", "a b,c"], ["--nodes", "'a b'"]),
        (["owner", "j", "--nodes", "a,b", "--weights", "c=1"], ["'c' is not one of --nodes"]),
        (["owner", "j", "--nodes", "a,b", "--weights", "a=0"], ["--weights", "a=0"]),
        (["owner", "j", "--nodes", "a,b", "--weights", "a"], ["--weights"]),
        (["owner", "j"], ["--nodes"]),
        (["frobnicate"], ["frobnicate"]),
        ([], ["COMMAND"]),
    ],
)
def test_bad_input_is_exit_2_with_stderr_only(
    capsys: pytest.CaptureFixture[str], argv: list[str], needles: list[str]
) -> None:
    assert_usage_error(*run(capsys, *argv), *needles)


WINDOWED = [
    pytest.param(
        [
            "@at 2026-12-24T09:00:00",
            "--tz",
            "Europe/Berlin",
            "--after",
            "2026-01-01T00:00:00Z",
            "--count",
            "3",
        ],
        ["2026-12-24T08:00:00Z"],
        "1 instant: a one-time schedule is due once, at 2026-12-24T08:00:00Z",
        id="at-once",
    ),
    pytest.param(
        [
            "0 * * * *",
            "--start",
            "2026-03-01T10:00:00Z",
            "--end",
            "2026-03-01T12:00:00Z",
            "--after",
            "2026-03-01T00:00:00Z",
            "--count",
            "5",
        ],
        ["2026-03-01T10:00:00Z", "2026-03-01T11:00:00Z", "2026-03-01T12:00:00Z"],
        "3 instants: no tick after the end, 2026-03-01T12:00:00Z",
        id="window",
    ),
    pytest.param(
        [
            "*/30 * * * *",
            "--tz",
            "America/New_York",
            "--end",
            "2026-03-08T07:00:00Z",
            "--after",
            "2026-03-08T05:45:00Z",
            "--count",
            "4",
        ],
        ["2026-03-08T06:00:00Z", "2026-03-08T06:30:00Z", "2026-03-08T07:00:00Z"],
        "3 instants: no tick after the end, 2026-03-08T07:00:00Z",
        id="end-at-the-spring-gap",
    ),
    pytest.param(
        [
            "0 9 * * *",
            "--tz",
            "Europe/Berlin",
            "--exclude",
            "* * 25 12 *",
            "--exclude",
            "2026-12-27..2026-12-28",
            "--after",
            "2026-12-23T12:00:00Z",
            "--count",
            "3",
        ],
        ["2026-12-24T08:00:00Z", "2026-12-26T08:00:00Z", "2026-12-29T08:00:00Z"],
        "",
        id="exclusions",
    ),
    pytest.param(
        ["0 * * * *", "--exclude", "* * * * *", "--count", "2"],
        [],
        "0 instants: the exclusions leave no further tick within the next 100 years",
        id="everything-excluded",
    ),
]


@pytest.mark.parametrize(("argv", "expected", "note"), WINDOWED)
def test_next_shows_the_effect_of_windows_and_exclusions(
    capsys: pytest.CaptureFixture[str], argv: list[str], expected: list[str], note: str
) -> None:
    code, out, err = run(capsys, "next", *argv)
    assert (code, out) == (0, expected)
    assert err == (f"hrwcron next: {note}\n" if note else "")


def test_next_explain_names_the_rule_that_excludes_each_tick(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["next", "@every 1h", "--exclude", "* * * * 6,0", "--explain", "--count", "2"]
    code, out, err = run(capsys, *argv, "--after", "2026-01-02T22:30:00Z")
    assert (code, err) == (0, "")
    assert out == [
        "2026-01-02T23:00:00Z  fires",
        # The whole weekend is one covered stretch: Saturday and Sunday in one step.
        "2026-01-03T00:00:00Z  excluded by '* * * * 6,0', and every tick before "
        "2026-01-05T00:00:00Z",
        "2026-01-05T00:00:00Z  fires",
    ]


def test_owner_prints_the_hrw_ranking(capsys: pytest.CaptureFixture[str]) -> None:
    nodes = ["scheduler-0", "scheduler-1", "scheduler-2", "scheduler-3"]
    code, out, err = run(capsys, "owner", "reports.daily", "--nodes", ",".join(nodes))
    assert (code, err) == (0, "")
    assert out == rank("reports.daily", nodes)
    assert sorted(out) == sorted(nodes)


def test_owner_weighted(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "owner", "j.1", "--nodes", "a, b ,c", "--weights", "a=1,b=2.5")
    assert code == 0
    assert out == weighted_rank("j.1", {"a": 1.0, "b": 2.5, "c": 1.0})


def test_owner_weighted_with_equal_weights_matches_plain_rank(
    capsys: pytest.CaptureFixture[str],
) -> None:
    plain = run(capsys, "owner", "job", "--nodes", "a,b,c,d")[1]
    assert (
        run(capsys, "owner", "job", "--nodes", "a,b,c,d", "--weights", "a=2,b=2,c=2,d=2")[1]
        == plain
    )


def test_check_config_accepts_the_example(
    capsys: pytest.CaptureFixture[str], clean_env: None
) -> None:
    code, out, err = run(capsys, "check-config", str(EXAMPLE))
    assert (code, err) == (0, "")
    assert len(out) == 1
    assert out[0].startswith(f"{EXAMPLE}: OK: 7 jobs, node id ")


def test_check_config_applies_or_ignores_the_environment(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, clean_env: None
) -> None:
    monkeypatch.setenv("HRWCRON_NODE_ID", "replica-9")
    code, out, _ = run(capsys, "check-config", str(EXAMPLE))
    assert code == 0 and out[0].endswith("node id replica-9")
    monkeypatch.setenv("HRWCRON_SCHEDULER_WIEGHT", "2")
    code, out, err = run(capsys, "check-config", str(EXAMPLE))
    assert_usage_error(code, out, err, "environment: HRWCRON_SCHEDULER_WIEGHT: ")
    code, out, _ = run(capsys, "check-config", "--no-env", str(EXAMPLE))
    assert code == 0 and "replica-9" not in out[0]


BROKEN = """\
[nats]
servers = ["nats://bob:s3cret@x:4222", "http://y"]
token = "t0k3n"

[scheduler]
member_ttl = 0.5
wieght = 2

[[jobs]]
name = "a"
schedule = "* * * * *"

[[jobs]]
name = "a"
schedule = "0 9 * * *"
tz = "Nowhere/Town"
max_lateness = "1 week"

[[jobs]]
name = "b"
schedule = "0 25 * * *"
"""


def test_check_config_prints_every_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, clean_env: None
) -> None:
    path = tmp_path / "broken.toml"
    path.write_text(BROKEN)
    code, out, err = run(capsys, "check-config", str(path))
    assert_usage_error(code, out, err)
    lines = err.splitlines()
    assert all(line.startswith(f"{path}: ") for line in lines)
    wheres = [line[len(f"{path}: ") :].split(": ", 1)[0] for line in lines]
    assert wheres == [
        "nats.servers[0]",
        "nats.servers[1]",
        "scheduler.wieght",
        "scheduler.member_ttl",
        "jobs[1].max_lateness",
        "jobs[1].tz",
        "jobs[1].name",
        "jobs[2].schedule",
    ]
    assert "s3cret" not in err and "t0k3n" not in err


def test_check_config_syntax_error_and_missing_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "syntax.toml"
    path.write_text("[nats]\nservers = [\n")
    code, out, err = run(capsys, "check-config", "--no-env", str(path))
    assert_usage_error(code, out, err, f"{path}: ", "invalid TOML")
    missing = tmp_path / "missing.toml"
    assert_usage_error(*run(capsys, "check-config", str(missing)), f"{missing}: cannot read")


def test_check_config_warns_without_failing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "fragile.toml"
    path.write_text("[scheduler]\nnode_id = 'n1'\nmember_ttl = 1.5\n")
    code, out, err = run(capsys, "check-config", "--no-env", str(path))
    assert code == 0
    assert out == [f"{path}: OK: 0 jobs, node id n1"]
    assert f"{path}: warning: scheduler.member_ttl: " in err


def test_version_and_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert (code, out) == (0, [f"hrwcron {__version__}"])
    code, out, _ = run(capsys, "--help")
    assert code == 0
    text = "\n".join(out)
    for command in ("next", "owner", "check-config"):
        assert command in text
    code, out, _ = run(capsys, "next", "--help")
    assert code == 0 and "--after" in "\n".join(out) and "examples:" in "\n".join(out)


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (1_772_953_200_000, "2026-03-08T07:00:00Z"),
        (1_772_953_200_007, "2026-03-08T07:00:00.007Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
    ],
)
def test_format_instant(ms: int, text: str) -> None:
    assert format_instant(ms) == text


def _hrwcron_command() -> list[str]:
    script = Path(sys.executable).with_name("hrwcron")
    return [str(script)] if script.exists() else [sys.executable, "-m", "hrwcron"]


def _env_without_hrwcron() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("HRWCRON_")}


def test_installed_console_script() -> None:
    result = subprocess.run(
        [
            *_hrwcron_command(),
            "next",
            "30 2 * * *",
            "--tz",
            "America/New_York",
            "--after",
            "2026-03-07T12:00:00Z",
            "--count",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_env_without_hrwcron(),
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "2026-03-08T07:00:00Z\n", "")


def test_python_dash_m_and_exit_code() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "hrwcron", "next", "30 2 * * *", "--after", "2026-03-07T12:00:00"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_env_without_hrwcron(),
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "no UTC offset" in result.stderr
    assert result.stderr.startswith("usage: hrwcron next")


def test_console_script_check_config_example() -> None:
    result = subprocess.run(
        [*_hrwcron_command(), "check-config", str(EXAMPLE)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=_env_without_hrwcron(),
    )
    assert result.returncode == 0, result.stderr
    assert "OK: 7 jobs" in result.stdout
