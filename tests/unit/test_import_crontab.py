"""The crontab importer, line by line: what cronie reads, and every refusal with its line."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import hrwcron.importers.crontab as crontab
from hrwcron.core.errors import ImportSourceError, InvalidInput
from hrwcron.core.model import JobSpec
from hrwcron.importers import CrontabOptions, Report, read_crontab
from hrwcron.importers.common import MAX_SOURCE_BYTES, command_slug
from hrwcron.importers.crontab import split_percent


def read(text: str | bytes, **options: object) -> Report:
    data = text.encode() if isinstance(text, str) else text
    return read_crontab(data, "tab", CrontabOptions(**options))  # type: ignore[arg-type]


def one(text: str, **options: object) -> JobSpec:
    report = read(text, **options)
    assert report.problems == []
    [spec] = report.specs
    return spec


def problems(text: str | bytes, **options: object) -> list[str]:
    report = read(text, **options)
    with pytest.raises(ImportSourceError) as caught:
        report.specs_or_raise()
    assert isinstance(caught.value, InvalidInput)
    return [str(p) for p in caught.value.problems]


def weekdays(spec: JobSpec, count: int = 14) -> set[int]:
    at = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    found = set()
    plan = spec.plan()
    for _ in range(count):
        due = plan.next_after(at)
        assert due is not None
        found.add(datetime.fromtimestamp(due / 1000, UTC).isoweekday() % 7)
        at = due
    return found


# --- refusals, each with its line --------------------------------------------------------------


def test_reboot_is_refused_at_its_line() -> None:
    [problem] = problems("# boot\nSHELL=/bin/sh\n@reboot /usr/local/bin/agent\n")
    assert problem.startswith("tab:3: @reboot runs once when cron starts")


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("0 0 L * * x", "day-of-month: 'L' is not a number (cronie has none of the L, W"),
        ("5/10 * * * * x", "cronie takes a step only after '*' or a range (write 5-59/10)"),
        ("61 * * * * x", "minute: '61' is out of range 0-59"),
        ("0 24 * * * x", "hour: '24' is out of range 0-23"),
        ("0 0 * * 8 x", "day-of-week: '8' is out of range 0-7"),
        ("0 0 * 13 * x", "month: '13' is out of range 1-12"),
        ("0-70/30 * * * * x", "minute: '60' in '0-70/30' is out of range 0-59"),
        ("0 17-9 * * * x", "hour: the range '17-9' runs backwards (17 > 9)"),
        ("*/0 * * * * x", "the step in '*/0' is not a whole number of at least 1"),
        ("1, * * * * x", "minute: an empty item in the list"),
        ("0 0 * * monday x", "'monday' is not a number or a name"),
        ("1~5/2 * * * * x", "a random value (~) takes no step"),
        ("@Daily x", "bad time specifier '@Daily'"),
        ("@every 5m x", "bad time specifier '@every'"),
        ("* * * * * * x", "it starts with '*' (a sixth time field? cronie has five)"),
        ("0 0 * *", "bad day-of-week: missing"),
        ("0 0 * * *", "bad command: the line ends after the schedule"),
        ("0 0 * * * -x cmd", "bad option '-x'"),
        ("0 0 * * * -n", "bad option '-n'"),
        ("0 0 31 2 * x", "schedule: day-of-month: no day in '31' exists in the month(s) '2'"),
        ("0 0 30 2 1-5/7 x", None),  # cronie's OR rule: Mondays of February fire, it is valid
    ],
)
def test_a_bad_field_is_refused_at_its_line_with_the_reason(line: str, needle: str | None) -> None:
    text = f"MAILTO=x\n\n{line}\n"
    if needle is None:
        assert read(text).problems == []
        return
    [problem] = problems(text)
    assert problem.startswith("tab:3: ") and needle in problem, problem


def test_a_command_or_standard_input_that_is_not_plain_text_is_refused() -> None:
    found = problems("0 1 * * * printf 'ring\x07'\n0 2 * * * cat%line one%\x1b[31mred\n")
    assert found == [
        "tab:1: the command is not plain text: it holds the control character '\\x07'",
        "tab:2: the standard input after % is not plain text: it holds the control character "
        "'\\x1b'",
    ]
    assert problems(b"0 3 * * * echo caf\xe9\n") == ["tab:1: is not UTF-8 text"]


def test_windows_line_endings_are_refused_with_the_reason() -> None:
    [problem] = problems("0 1 * * * /bin/true\r\n")
    assert problem.startswith("tab:1: ends with a carriage return (Windows line endings)")


def test_a_last_line_without_a_newline_is_refused_as_cronie_ignores_it() -> None:
    [problem] = problems("0 1 * * * a\n0 2 * * * b")
    assert problem.startswith("tab:2: the file does not end with a newline")
    # A last comment or blank line without one is nothing cronie loses.
    assert len(read("0 1 * * * a\n# end").specs) == 1


def test_a_bad_cron_tz_is_refused_at_its_own_line_once() -> None:
    found = problems("CRON_TZ=Mars/Olympus\n0 1 * * * a\n0 2 * * * b\n")
    assert found == [
        "tab:1: CRON_TZ: 'Mars/Olympus' is not an IANA time zone name such as 'UTC' or "
        "'Europe/Berlin' ('localtime', 'posix/...', 'right/...' and 'Factory' depend on the host)"
    ]


def test_a_random_delay_beyond_an_hour_is_refused() -> None:
    [problem] = problems("RANDOM_DELAY=90\n0 1 * * * a\n")
    assert problem.startswith("tab:1: RANDOM_DELAY=90: hrwcron delays a job by at most 60")


def test_a_bad_name_comment_and_a_name_given_twice_are_refused() -> None:
    found = problems(
        "# name: has space\n0 1 * * * a\n# name: same\n0 2 * * * b\n# name: same\n0 3 * * * c\n"
    )
    assert found[0].startswith("tab:1: name: 'has space' has the bad token")
    assert found[1] == "tab:6: the job name 'same' is already taken at tab:4"


def test_every_problem_of_a_file_is_reported_at_once_and_no_spec_comes_out() -> None:
    report = read("@reboot a\n0 0 * * * ok\n99 * * * * b\n0 0 L * * c\n")
    assert [p.where for p in report.problems] == ["tab:1", "tab:3", "tab:4"]
    with pytest.raises(ImportSourceError):
        report.specs_or_raise()


def test_a_file_larger_than_the_bound_is_refused_without_reading_its_lines() -> None:
    data = b"# " + b"x" * MAX_SOURCE_BYTES + b"\n"
    [problem] = problems(data)
    assert problem == f"tab: is more than {MAX_SOURCE_BYTES} bytes, the most one file may be"


# --- what cronie reads ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        ("cat", ("cat", None)),
        ("cat%", ("cat", None)),  # an empty standard input is none
        ("mail -s hi root%Dear all,%done%", ("mail -s hi root", "Dear all,\ndone\n")),
        ("echo 100\\% done", ("echo 100% done", None)),
        ("printf '%s\\n'", ("printf '", "s\\n'\n")),
        ("cat%a\\%b", ("cat", "a%b\n")),
        ("cat%ends with a backslash\\", ("cat", "ends with a backslash\\\n")),
        ("echo \\\\%rest", ("echo \\\\", "rest\n")),
        ("cat%x\\\\%y", ("cat", "x\\%y\n")),
        ("cat%%", ("cat", "\n")),
    ],
)
def test_percent_splits_a_command_as_cronie_does(
    command: str, expected: tuple[str, str | None]
) -> None:
    assert split_percent(command) == expected


def test_the_payload_holds_command_standard_input_user_and_the_variables_above() -> None:
    report = read(
        'MAILTO=""\n'
        "0 1 * * * root first\n"
        " PATH = /usr/bin:/bin \n"
        "FOO='quoted value'  \n"
        "0 2 * * * www-data second%input%\n",
        system=True,
    )
    first, second = report.specs
    assert first.payload == {"command": "first", "user": "root", "env": {"MAILTO": ""}}
    assert second.payload == {
        "command": "second",
        "stdin": "input\n",
        "user": "www-data",
        "env": {"MAILTO": "", "PATH": "/usr/bin:/bin", "FOO": "quoted value"},
    }


def test_a_line_that_only_looks_like_a_variable_is_an_entry() -> None:
    # An unterminated quote is no variable to cronie, so the line is read as an entry.
    [problem] = problems('FOO="open\n')
    assert problem.startswith("tab:1: minute:")


def test_a_user_crontab_records_the_owner_given() -> None:
    spec = one("0 1 * * * backup\n", user="alice")
    assert spec.payload == {"command": "backup", "user": "alice"}
    assert "user" not in one("0 1 * * * backup\n").payload


def test_cron_tz_sets_the_zone_below_it_and_an_empty_one_goes_back_to_the_host() -> None:
    report = read(
        "0 1 * * * a\nCRON_TZ=Asia/Tokyo\n0 1 * * * b\nCRON_TZ=\n0 1 * * * c\n",
        tz="Europe/Paris",
    )
    assert [s.tz for s in report.specs] == ["Europe/Paris", "Asia/Tokyo", "Europe/Paris"]


def test_tz_reaches_the_environment_only_and_says_so() -> None:
    report = read("TZ=Asia/Tokyo\n0 1 * * * a\n")
    [spec] = report.specs
    assert spec.tz == "UTC" and spec.payload["env"] == {"TZ": "Asia/Tokyo"}
    [note] = report.notes
    assert note.where == "tab:1" and "environment only" in note.message


def test_a_trailing_backslash_is_no_continuation() -> None:
    report = read("0 1 * * * echo one \\\n0 2 * * * echo two\n")
    assert [s.payload["command"] for s in report.specs] == ["echo one \\", "echo two"]
    [note] = report.notes
    assert note.where == "tab:1" and "no line continuations" in note.message


def test_options_and_marks_before_the_command() -> None:
    spec = one("-0 1 * * * -n /usr/bin/certbot renew\n")
    assert spec.schedule == "0 1 * * *"
    assert spec.payload == {"command": "/usr/bin/certbot renew", "mail_only_on_error": True}


def test_macros_are_read_as_cronie_spells_them() -> None:
    report = read(
        "@yearly a\n@annually b\n@monthly c\n@weekly d\n@daily e\n@midnight f\n@hourly g\n"
    )
    assert [s.schedule for s in report.specs] == [
        "@yearly",
        "@annually",
        "@monthly",
        "@weekly",
        "@daily",
        "@midnight",
        "@hourly",
    ]


def test_a_day_of_week_range_ending_in_zero_ends_on_sunday_as_cronie_reads_it() -> None:
    spec = one("0 12 * * 5-0 weekend\n")
    assert weekdays(spec) == {5, 6, 0}
    assert weekdays(one("0 12 * * fri-sun weekend\n")) == {5, 6, 0}
    assert weekdays(one("0 12 * * sun-sun sunday\n")) == {0}


def test_a_random_value_becomes_one_hashed_value_in_its_range() -> None:
    report = read("10~40 3 * * * a\n~ 4 * * * b\n")
    a, b = report.specs
    assert a.schedule == "H(10-40) 3 * * *" and b.schedule == "H(0-59) 4 * * *"
    plan = a.plan()
    at = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1000)
    minutes = set()
    for _ in range(5):
        due = plan.next_after(at)
        assert due is not None
        minutes.add(datetime.fromtimestamp(due / 1000, UTC).minute)
        at = due
    [minute] = minutes  # one value, the same every day
    assert 10 <= minute <= 40


def test_random_delay_becomes_jitter_and_a_bad_one_is_ignored_as_cronie_does() -> None:
    report = read("RANDOM_DELAY=15\n0 1 * * * a\nRANDOM_DELAY=-3\n0 2 * * * b\n")
    assert [s.jitter for s in report.specs] == [900.0, 0.0]
    assert [n.where for n in report.notes] == ["tab:3"]


# --- names -------------------------------------------------------------------------------------


def test_names_come_from_a_name_comment_else_from_the_command_made_unique_in_file_order() -> None:
    report = read(
        "# name: reports.daily\n"
        "# Sends the daily report\n"
        "0 6 * * * /opt/bin/report --daily\n"
        "0 7 * * * /opt/bin/report --daily\n"
        "0 8 * * * /opt/bin/report --daily\n"
        "# name: report-daily\n"
        "0 9 * * * /opt/bin/other\n",
        prefix="host1",
    )
    assert [s.name for s in report.specs] == [
        "host1.reports.daily",
        "host1.report-daily-2",  # report-daily is asked for below
        "host1.report-daily-3",
        "host1.report-daily",
    ]
    assert report.specs[0].description == "Sends the daily report"
    assert report.specs[1].description == ""


def test_a_name_comment_not_directly_above_an_entry_names_nothing_and_says_so() -> None:
    report = read("# name: lost\n\n0 6 * * * /opt/bin/run\n")
    assert [s.name for s in report.specs] == ["run"]
    [note] = report.notes
    assert note.where == "tab:1" and "names nothing" in note.message


def test_header_comments_do_not_become_a_description() -> None:
    spec = one("# m h  dom mon dow   command\n0 6 * * * /opt/bin/run\n")
    assert spec.description == ""


@pytest.mark.parametrize(
    ("command", "slug"),
    [
        ("/usr/local/bin/backup.sh --full > /var/log/backup.log 2>&1", "backup-sh-full"),
        ("cd /srv/app && php artisan schedule:run >> /dev/null 2>&1", "php-artisan-schedule-run"),
        (
            "test -x /usr/sbin/anacron || ( cd / && run-parts --report /etc/cron.daily )",
            "run-parts-report-cron-daily",
        ),
        ("mysqldump shop | gzip > /backup/shop.sql.gz", "mysqldump-shop"),
        ("LANG=C /usr/bin/updatedb", "updatedb"),
        (":", "job"),
        ("x" * 100, "x" * 48),
    ],
)
def test_a_command_gives_a_valid_stable_slug(command: str, slug: str) -> None:
    assert command_slug(command) == slug


def test_more_entries_than_the_bound_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(crontab, "MAX_ENTRIES", 3)
    assert len(read("0 1 * * * a\nX=1\n0 2 * * * b\n0 3 * * * c\n").specs) == 3
    found = problems("0 1 * * * a\n0 2 * * * b\n0 3 * * * c\n0 4 * * * d\n0 5 * * * e\n")
    assert found == ["tab:4: more than 3 entries; import fewer at once"]
