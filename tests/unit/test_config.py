"""Configuration loading: defaults, every problem reported at once, env overlay, secrets."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from hrwcron.cli import main
from hrwcron.core.config import (
    Config,
    ConfigFileError,
    config_warnings,
    default_node_id,
    load_config,
    parse_config,
    redact_secrets,
    redact_url,
)
from hrwcron.core.errors import ConfigError
from hrwcron.process.host import node_id

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "hrwcron.toml"

GOOD_JOBS = """
[[jobs]]
name = "a"
schedule = "* * * * *"
"""


def parse(text: str, env: dict[str, str] | None = None) -> Config:
    return parse_config(text, "test.toml", env or {})


def problems(text: str, env: dict[str, str] | None = None) -> ConfigFileError:
    with pytest.raises(ConfigFileError) as info:
        parse(text, env)
    return info.value


def wheres(err: ConfigError) -> set[str]:
    return {p.where for p in err.problems}


def test_defaults_without_file() -> None:
    cfg = load_config(None, {})
    assert cfg.nats.servers == ["nats://127.0.0.1:4222"]
    assert cfg.nats.connect_timeout == 2.0
    assert cfg.nats.name == "hrwcron"
    assert cfg.nats.tls_handshake_first is False
    s = cfg.scheduler
    # Left empty by the configuration; the process fills in the host's name.
    assert s.node_id == ""
    assert node_id(cfg) == default_node_id(socket.gethostname())
    assert (s.weight, s.tags) == (1.0, [])
    assert (s.heartbeat_interval, s.member_ttl, s.failover_step) == (1.0, 3.0, 1.0)
    assert (s.claim_lease, s.max_clock_skew, s.membership_refresh) == (2.0, 1.0, 1.0)
    assert s.max_payload == 65536
    assert (s.members_bucket, s.claims_bucket) == ("hrwcron_members", "hrwcron_claims")
    assert (s.jobs_bucket, s.runs_bucket) == ("hrwcron_jobs", "hrwcron_runs")
    assert (s.stream, s.subject_prefix) == ("HRWCRON_TRIGGERS", "hrwcron.trigger")
    assert s.stream_subjects == "hrwcron.trigger.>"
    assert (s.replicas, s.storage, s.claims_storage) == (1, "file", "memory")
    assert (s.duplicate_window, s.stream_max_age) == (600.0, 86400.0)
    assert (s.apply_jobs, s.shutdown_timeout, s.max_in_flight, s.per_job_metrics) == (
        True,
        5.0,
        512,
        True,
    )
    assert cfg.http.listen == "127.0.0.1:9464"
    t = cfg.telemetry
    assert (t.log_format, t.log_level, t.traces, t.service_name) == (
        "text",
        "info",
        False,
        "hrwcron",
    )
    assert cfg.jobs == []
    assert config_warnings(cfg) == []


def test_check_config_names_the_host_when_the_file_names_no_node(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The configuration leaves the node id empty; the command must still show the one the
    # replica would use, not an empty one.
    path = tmp_path / "c.toml"
    path.write_text("")
    assert main(["check-config", "--no-env", str(path)]) == 0
    expected = default_node_id(socket.gethostname())
    assert capsys.readouterr().out.strip() == f"{path}: OK: 0 jobs, node id {expected}"


def test_empty_file_is_the_defaults() -> None:
    assert parse("") == load_config(None, {})


@pytest.mark.parametrize(
    ("host", "node"),
    [
        ("web-1", "web-1"),
        ("web-1.eu.example.com", "web-1-eu-example-com"),
        ("ip-10-0-0-1 (prod)", "ip-10-0-0-1-prod"),
        ("...", "hrwcron"),
        ("", "hrwcron"),
        ("a" * 100, "a" * 64),
    ],
)
def test_default_node_id_is_kv_key_safe(host: str, node: str) -> None:
    assert default_node_id(host) == node


def test_jobs_and_duration_strings() -> None:
    cfg = parse(
        """
        [scheduler]
        node_id = "n-1"
        heartbeat_interval = "500ms"
        member_ttl = 2
        duplicate_window = "1h"

        [[jobs]]
        name = "reports.daily"
        schedule = "30 2 * * *"
        tz = "America/New_York"
        max_lateness = "15m"
        jitter = "1m30s"
        payload = { a = 1, b = ["x"] }
        tags = ["gpu"]

        [[jobs]]
        name = "b"
        schedule = "@every 90s"
        max_lateness = 45
        jitter = 2.5
        """
    )
    assert cfg.scheduler.node_id == "n-1"
    assert cfg.scheduler.heartbeat_interval == 0.5
    assert cfg.scheduler.member_ttl == 2.0
    assert cfg.scheduler.duplicate_window == 3600.0
    first, second = cfg.jobs
    assert (first.name, first.tz, first.max_lateness, first.jitter) == (
        "reports.daily",
        "America/New_York",
        900.0,
        90.0,
    )
    assert first.payload == {"a": 1, "b": ["x"]}
    assert first.tags == ["gpu"]
    assert (second.max_lateness, second.jitter, second.tz) == (45.0, 2.5, "UTC")


BROKEN = """
[nats]
servers = ["nats://127.0.0.1:4222", "http://127.0.0.1:8222"]
password = "hunter2"
creds = "does-not-exist.creds"
tls_cert = "cert.pem"
connect_timeout = "soon"

[scheduler]
weight = 0
member_ttl = 0.5
hearbeat_interval = 1
storage = "disk"
claims_storage = "ssd"
replicas = 7
stream_max_age = 60
node_id = "web 1"

[http]
listen = "localhost"

[telemetry]
log_level = "verbose"

[[jobs]]
name = "a"
schedule = "* * * * *"

[[jobs]]
name = "a"
schedule = "0 * * * *"

[[jobs]]
name = "bad-schedule"
schedule = "61 * * * *"

[[jobs]]
name = "bad-zone"
schedule = "0 9 * * *"
tz = "Mars/Olympus_Mons"

[[jobs]]
name = "no-schedule"

[[jobs]]
name = "late"
schedule = "0 9 * * *"
max_lateness = "forever"

[[jobs]]
name = "same-subject"
schedule = "0 9 * * *"
subject = "hrwcron.trigger.a"

[[jobs]]
name = "bad name!"
schedule = "0 9 * * *"
colour = "blue"
"""


def test_broken_file_reports_every_problem_at_once() -> None:
    err = problems(BROKEN)
    expected = {
        "nats.servers[1]",
        "nats.password",
        "nats.creds",
        "nats.tls_cert",
        "nats.connect_timeout",
        "scheduler.weight",
        "scheduler.member_ttl",
        "scheduler.hearbeat_interval",
        "scheduler.storage",
        "scheduler.claims_storage",
        "scheduler.replicas",
        "scheduler.stream_max_age",
        "scheduler.node_id",
        "http.listen",
        "telemetry.log_level",
        "jobs[1].name",
        "jobs[2].schedule",
        "jobs[3].tz",
        "jobs[4].schedule",
        "jobs[5].max_lateness",
        "jobs[6].subject",
        "jobs[7].name",
        "jobs[7].colour",
    }
    assert wheres(err) == expected
    by_where = {p.where: p.message for p in err.problems}
    assert "heartbeat_interval" in by_where["scheduler.hearbeat_interval"]  # suggests the fix
    assert "nats://" in by_where["nats.servers[1]"]
    assert "needs nats.user" in by_where["nats.password"]
    assert "jobs[0]" in by_where["jobs[1].name"]
    assert "jobs[0]" in by_where["jobs[6].subject"]
    assert "is required" in by_where["jobs[4].schedule"]
    assert "'disk'" in by_where["scheduler.storage"]
    assert "'ssd'" in by_where["scheduler.claims_storage"]
    # Every line names the file, as check-config prints them.
    assert all(line.startswith("test.toml: ") for line in err.lines())
    assert "test.toml: scheduler.member_ttl: " in str(err)
    assert isinstance(err, ConfigError)


def test_a_bad_value_does_not_cause_follow_on_errors() -> None:
    err = problems('[scheduler]\nheartbeat_interval = "fast"\nmember_ttl = 0.5\n')
    assert wheres(err) == {"scheduler.heartbeat_interval"}


def test_toml_syntax_error_gives_line_and_column() -> None:
    err = problems('[nats]\nname = "x"\nservers = \n')
    (problem,) = err.problems
    assert problem.where == "line 3, column 11"
    assert problem.message.startswith("invalid TOML: ")
    assert err.lines() == [f"test.toml: line 3, column 11: {problem.message}"]


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("[natz]\n", "natz"),
        ("[nats]\nserver = 'nats://x:4222'\n", "nats.server"),
        ("[http]\nport = 80\n", "http.port"),
        ("[telemetry]\nlevel = 'info'\n", "telemetry.level"),
        (GOOD_JOBS + "tzz = 'UTC'\n", "jobs[0].tzz"),
        ("jobs = 3\n", "jobs"),
        ("nats = 'x'\n", "nats"),
    ],
)
def test_unknown_keys_and_wrong_shapes_are_rejected(text: str, where: str) -> None:
    assert wheres(problems(text)) == {where}


def test_type_errors_name_the_field() -> None:
    err = problems(
        "[scheduler]\nreplicas = 1.5\napply_jobs = 'yes'\ntags = ['ok', 3]\n"
        "[nats]\nservers = 'nats://x:4222'\n"
    )
    assert wheres(err) == {
        "scheduler.replicas",
        "scheduler.apply_jobs",
        "scheduler.tags[1]",
        "nats.servers",
    }


def test_non_finite_numbers_are_rejected() -> None:
    assert wheres(problems("[scheduler]\nweight = inf\nmember_ttl = nan\n")) == {
        "scheduler.weight",
        "scheduler.member_ttl",
    }


def test_url_key_is_a_comma_separated_server_list() -> None:
    cfg = parse('[nats]\nurl = "nats://a:4222, tls://b:4222"\n')
    assert cfg.nats.servers == ["nats://a:4222", "tls://b:4222"]
    err = problems('[nats]\nurl = "nats://a:4222"\nservers = ["nats://b:4222"]\n')
    assert wheres(err) == {"nats.url"}
    err = problems('[nats]\nurl = "ftp://a"\n')
    assert wheres(err) == {"nats.servers[0]"}
    assert "nats.url" in err.problems[0].message


def test_lateness_must_fit_the_duplicate_window() -> None:
    err = problems(
        "[scheduler]\nduplicate_window = '2m'\n"
        + GOOD_JOBS
        + "max_lateness = '5m'\n"
        + "[[jobs]]\nname='b'\nschedule='@hourly'\nmax_lateness = '10m'\n"
    )
    (problem,) = err.problems
    assert problem.where == "scheduler.duplicate_window"
    assert "jobs[1] (b)" in problem.message


def test_duplicate_window_must_cover_the_default_lateness() -> None:
    # A replica would create a stream with this window that every later replica refuses.
    (problem,) = problems("[scheduler]\nduplicate_window = '30s'\n").problems
    assert problem.where == "scheduler.duplicate_window"
    assert "at least 60 s" in problem.message
    assert parse("[scheduler]\nduplicate_window = '60s'\n").scheduler.duplicate_window == 60.0


def test_jobs_are_checked_against_the_configured_prefix_and_payload_limit() -> None:
    err = problems(
        "[scheduler]\nsubject_prefix = 'acme.cron'\nmax_payload = 16\n"
        + GOOD_JOBS
        + "subject = 'hrwcron.trigger.a'\npayload = 'a string longer than sixteen bytes'\n"
    )
    assert wheres(err) == {"jobs[0].subject", "jobs[0].payload"}
    cfg = parse("[scheduler]\nsubject_prefix = 'acme.cron'\n" + GOOD_JOBS)
    assert cfg.jobs[0].trigger_subject(cfg.scheduler.subject_prefix) == "acme.cron.a"


def test_scheduler_names_are_checked() -> None:
    err = problems(
        "[scheduler]\nclaims_bucket = 'hrwcron_members'\nruns_bucket = 'runs.v1'\n"
        "stream = 'TRIGGERS.V1'\nsubject_prefix = 'hrwcron.*'\n"
    )
    assert wheres(err) == {
        "scheduler.claims_bucket",
        "scheduler.runs_bucket",
        "scheduler.stream",
        "scheduler.subject_prefix",
    }


def test_auth_methods_and_files(tmp_path: Path) -> None:
    (tmp_path / "app.creds").write_text("creds")
    (tmp_path / "cert.pem").write_text("cert")
    (tmp_path / "key.pem").write_text("key")
    good = tmp_path / "good.toml"
    good.write_text(
        '[nats]\nservers = ["tls://nats.example:4222"]\ncreds = "app.creds"\n'
        'tls_cert = "cert.pem"\ntls_key = "key.pem"\ntls_handshake_first = true\n'
    )
    # Relative paths are resolved against the file's directory, not the working directory.
    cfg = load_config(str(good), {})
    assert cfg.nats.creds == str(tmp_path / "app.creds")
    assert cfg.nats.tls_key == str(tmp_path / "key.pem")

    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[nats]\nservers = ["nats://x:4222"]\ncreds = "app.creds"\ntoken = "t0k"\n'
        'nkey_seed = "missing.nk"\ntls_key = "key.pem"\ntls_handshake_first = true\n'
        'user = "bob"\n'
    )
    with pytest.raises(ConfigFileError) as info:
        load_config(str(bad), {})
    by_where = {p.where: p.message for p in info.value.problems}
    assert set(by_where) == {
        "nats.token",
        "nats.creds",
        "nats.nkey_seed",
        "nats.user",
        "nats.tls_key",
        "nats.tls_handshake_first",
    }
    assert "conflicts with nats.user" in by_where["nats.token"]
    assert info.value.source == str(bad)


def test_credentials_in_url_and_in_settings_conflict() -> None:
    err = problems('[nats]\nservers = ["nats://bob:pw@x:4222"]\ntoken = "t"\n')
    assert wheres(err) == {"nats.servers[0]"}


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError) as info:
        load_config(str(tmp_path / "nope.toml"), {})
    assert str(tmp_path / "nope.toml") in str(info.value)


def test_env_overlay() -> None:
    cfg = parse(
        "[scheduler]\nweight = 3.0\n[telemetry]\nlog_level = 'debug'\n",
        {
            "HRWCRON_NATS_URL": "nats://a:4222,nats://b:4222",
            "HRWCRON_NODE_ID": "replica-7",
            "HRWCRON_HTTP_LISTEN": "",
            "HRWCRON_LOG_LEVEL": "warning",
            "HRWCRON_LOG_FORMAT": "json",
            "HRWCRON_SCHEDULER_WEIGHT": "2.5",
            "HRWCRON_SCHEDULER_MEMBER_TTL": "5s",
            "HRWCRON_SCHEDULER_HEARTBEAT_INTERVAL": "1.5",
            "HRWCRON_SCHEDULER_APPLY_JOBS": "false",
            "HRWCRON_SCHEDULER_REPLICAS": "3",
            "HRWCRON_SCHEDULER_TAGS": "gpu, eu",
            "HRWCRON_TELEMETRY_TRACES": "1",
            "HRWCRON_NATS_USER": "bob",
            "HRWCRON_NATS_PASSWORD": "pw",
            "HRWCRON_CONFIG": "/etc/hrwcron.toml",  # names the file; not a setting
            "PATH": "/usr/bin",
        },
    )
    assert cfg.nats.servers == ["nats://a:4222", "nats://b:4222"]
    assert cfg.scheduler.node_id == "replica-7"
    assert cfg.http.listen == ""
    assert (cfg.telemetry.log_level, cfg.telemetry.log_format) == ("warning", "json")
    assert cfg.telemetry.traces is True
    assert cfg.scheduler.weight == 2.5  # the environment wins over the file
    assert (cfg.scheduler.member_ttl, cfg.scheduler.heartbeat_interval) == (5.0, 1.5)
    assert cfg.scheduler.apply_jobs is False
    assert cfg.scheduler.replicas == 3
    assert cfg.scheduler.tags == ["gpu", "eu"]
    assert (cfg.nats.user, cfg.nats.password) == ("bob", "pw")


def test_env_errors_name_the_variable() -> None:
    err = problems(
        "",
        {
            "HRWCRON_SCHEDULER_WEIGHT": "heavy",
            "HRWCRON_SCHEDULER_REPLICAS": "2.5",
            "HRWCRON_SCHEDULER_PER_JOB_METRICS": "maybe",
            "HRWCRON_LOG_LEVEL": "loud",
            "HRWCRON_SCHEDULER_MEMBERTTL": "3",
            "HRWCRON_FOO": "1",
        },
    )
    assert wheres(err) == {
        "HRWCRON_SCHEDULER_WEIGHT",
        "HRWCRON_SCHEDULER_REPLICAS",
        "HRWCRON_SCHEDULER_PER_JOB_METRICS",
        "HRWCRON_LOG_LEVEL",
        "HRWCRON_SCHEDULER_MEMBERTTL",
        "HRWCRON_FOO",
    }
    by_where = {p.where: p.message for p in err.problems}
    assert "scheduler.weight" in by_where["HRWCRON_SCHEDULER_WEIGHT"]
    assert "HRWCRON_SCHEDULER_MEMBER_TTL" in by_where["HRWCRON_SCHEDULER_MEMBERTTL"]
    assert "unknown variable" in by_where["HRWCRON_FOO"]
    assert all(line.startswith("environment: HRWCRON_") for line in err.lines())


def test_env_values_are_validated_like_file_values() -> None:
    err = problems("", {"HRWCRON_SCHEDULER_MEMBER_TTL": "0.5"})
    (problem,) = err.problems
    assert problem.where == "scheduler.member_ttl"
    assert "HRWCRON_SCHEDULER_MEMBER_TTL" in problem.message


def test_env_alias_conflict() -> None:
    env = {"HRWCRON_NODE_ID": "a", "HRWCRON_SCHEDULER_NODE_ID": "b"}
    assert len(problems("", env).problems) == 1
    same = {"HRWCRON_NODE_ID": "a", "HRWCRON_SCHEDULER_NODE_ID": "a"}
    assert parse("", same).scheduler.node_id == "a"


SECRETS = ("hunter2", "s3cret", "t0ken-value", "urltoken")


def test_secrets_never_appear_in_repr() -> None:
    cfg = parse('[nats]\nservers = ["nats://bob:s3cret@a:4222", "tls://urltoken@b:4222"]\n')
    cfg2 = parse('[nats]\nuser = "alice"\npassword = "hunter2"\n')
    cfg3 = parse('[nats]\ntoken = "t0ken-value"\n')
    texts = [repr(cfg), str(cfg), repr(cfg.nats), str(cfg2), str(cfg3), repr(cfg3.redacted())]
    for text in texts:
        for secret in SECRETS:
            assert secret not in text
    assert "'nats://bob:***@a:4222', 'tls://***@b:4222'" in repr(cfg)
    assert cfg2.redacted()["nats"]["password"] == "***"
    assert cfg2.redacted()["nats"]["user"] == "alice"
    # The real values stay available to the code that connects.
    assert cfg2.nats.password == "hunter2"
    assert cfg.nats.servers[0] == "nats://bob:s3cret@a:4222"


def test_secrets_never_appear_in_errors() -> None:
    in_file = problems(
        '[nats]\nservers = ["http://bob:s3cret@a:4222", "nats//urltoken@b"]\n'
        "password = 12345678\ntoken = 'hunter2'\ncreds = 'x.creds'\n"
    )
    in_env = problems("", {"HRWCRON_NATS_URL": "http://eve:t0ken-value@c,nats://a"})
    texts = [str(in_file), *in_file.lines(), str(in_env), *in_env.lines()]
    for text in texts:
        for secret in (*SECRETS, "12345678"):
            assert secret not in text
    assert "'http://bob:***@a:4222'" in str(in_file)
    assert "'***@b'" in str(in_file)
    assert "'http://eve:***@c'" in str(in_env)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("nats://bob:pw@host:4222", "nats://bob:***@host:4222"),
        ("tls://token@host", "tls://***@host"),
        ("wss://bob:p@ss/word@host/path", "wss://bob:***@host/path"),
        ("bob:pw@host:4222", "bob:***@host:4222"),
        ("not a url", "not a url"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_warnings_for_fragile_timings() -> None:
    cfg = parse("[scheduler]\nheartbeat_interval = 1\nmember_ttl = 1.5\nmembership_refresh = 2\n")
    assert {p.where for p in config_warnings(cfg)} == {
        "scheduler.member_ttl",
        "scheduler.membership_refresh",
    }


def test_example_file_is_valid() -> None:
    cfg = load_config(str(EXAMPLE), {})
    assert len(cfg.jobs) >= 3
    assert any(job.tz != "UTC" for job in cfg.jobs)
    assert config_warnings(cfg) == []


def test_jobs_accept_the_extended_cron_forms_and_name_the_field_of_a_bad_one() -> None:
    cfg = parse(
        """
[[jobs]]
name = "month-end"
schedule = "0 0 L * *"

[[jobs]]
name = "spread.hourly"
schedule = "H * * * *"

[[jobs]]
name = "quartz"
schedule = "0 0 9 ? * 1#2"
"""
    )
    assert [job.schedule for job in cfg.jobs] == ["0 0 L * *", "H * * * *", "0 0 9 ? * 1#2"]
    err = problems(
        """
[[jobs]]
name = "ok"
schedule = "H H * * *"

[[jobs]]
name = "never"
schedule = "0 0 31W 4 *"

[[jobs]]
name = "sixth-monday"
schedule = "0 9 * * 1#6"
"""
    )
    by_where = {p.where: p.message for p in err.problems}
    assert set(by_where) == {"jobs[1].schedule", "jobs[2].schedule"}
    assert by_where["jobs[1].schedule"].startswith("day-of-month: ")
    assert "never fires" in by_where["jobs[1].schedule"]
    assert by_where["jobs[2].schedule"].startswith("day-of-week: ")


def test_jobs_take_windows_exclusions_run_limits_and_toml_dates() -> None:
    cfg = parse(
        """
[[jobs]]
name = "campaign"
schedule = "0 * * * *"
tz = "Europe/Berlin"
start = 2026-03-01T00:00:00+01:00
end = "2026-03-31T23:00:00+02:00"
exclude = [2026-03-15, "2026-03-20..2026-03-22", "* 0-6 * * *"]
max_runs = 500
delete_after = "1h"

[[jobs]]
name = "remind"
schedule = "@at 2020-12-24T09:00:00"
delete_after = 60
"""
    )
    campaign, remind = cfg.jobs
    # A TOML date-time or date written without quotes is read as its ISO text.
    assert campaign.start == "2026-03-01T00:00:00+01:00"
    assert campaign.exclude == ["2026-03-15", "2026-03-20..2026-03-22", "* 0-6 * * *"]
    assert (campaign.max_runs, campaign.delete_after) == (500, 3600.0)
    # An @at in the past loads: a file that worked keeps working after its one-time jobs ran.
    assert remind.schedule == "@at 2020-12-24T09:00:00"


def test_bad_window_fields_are_located_in_the_file() -> None:
    err = problems(
        """
[[jobs]]
name = "backwards"
schedule = "0 * * * *"
start = 2026-03-02T00:00:00Z
end = 2026-03-01T00:00:00Z

[[jobs]]
name = "local"
schedule = "0 * * * *"
start = 2026-03-01T00:00:00
exclude = ["2026-12-24", "* * 32 * *"]
max_runs = 0

[[jobs]]
name = "forever"
schedule = "0 * * * *"
delete_after = "1h"
"""
    )
    by_where = {p.where: p.message for p in err.problems}
    assert set(by_where) == {
        "jobs[0].end",
        "jobs[1].start",
        "jobs[1].exclude[1]",
        "jobs[1].max_runs",
        "jobs[2].delete_after",
    }
    assert "is before start" in by_where["jobs[0].end"]
    assert "no UTC offset" in by_where["jobs[1].start"]
    assert "day-of-month" in by_where["jobs[1].exclude[1]"]
    assert "run out of ticks" in by_where["jobs[2].delete_after"]


def test_claims_storage_follows_storage_memory_and_its_own_setting() -> None:
    from hrwcron.adapters.jetstream.provision import Layout, StorageType

    assert Layout().claims_storage_type == StorageType.MEMORY
    assert Layout(claims_storage="file").claims_storage_type == StorageType.FILE
    # Everything in memory includes the claims, whatever claims_storage says.
    assert Layout(storage="memory", claims_storage="file").claims_storage_type == (
        StorageType.MEMORY
    )


SEED = "SUACSSL3UAHUDXKFSNVUZRF5UHPMWZ6BFDTJ7M6USDXIEDNPPQYYYCU3VY"
JWT = "eyJ0eXAiOiJKV1QiLCJhbGciOiJlZDI1NTE5LW5rZXkifQ.eyJqdGkiOiJBQkMifQ.c2lnbmF0dXJl"
CREDS = f"-----BEGIN NATS USER JWT-----\n{JWT}\n------END NATS USER JWT------\n"


@pytest.mark.parametrize("variable", ["HRWCRON_NATS_NKEY_SEED", "HRWCRON_NATS_CREDS"])
@pytest.mark.parametrize("value", [SEED, JWT, CREDS])
def test_a_secret_given_where_a_path_belongs_is_never_echoed(variable: str, value: str) -> None:
    found = problems("", {variable: value})
    texts = [str(found), *found.lines()]
    for text in texts:
        assert SEED not in text and JWT not in text and "BEGIN NATS" not in text
    assert "looks like a secret" in str(found)


def test_secret_shapes_are_masked_in_any_text() -> None:
    line = f"connect failed: seed {SEED} jwt {JWT} creds {CREDS} at nats://a:4222"
    masked = redact_secrets(line)
    assert SEED not in masked and JWT not in masked and "BEGIN" not in masked
    assert masked.startswith("connect failed: seed *** jwt *** creds ***")
    # A path or an ordinary word is left as it is.
    assert redact_secrets("/etc/nats/seed.nk SUNDAY") == "/etc/nats/seed.nk SUNDAY"


def test_the_status_token_is_masked_like_a_password() -> None:
    cfg = parse('[http]\nstatus_token = "st-0123456789abcdef"\n')
    assert "st-0123456789abcdef" not in repr(cfg) + str(cfg.redacted())
    assert cfg.redacted()["http"]["status_token"] == "***"
    assert [p.where for p in problems('[http]\nstatus_token = "short"\n').problems] == [
        "http.status_token"
    ]
