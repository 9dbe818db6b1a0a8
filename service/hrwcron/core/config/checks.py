"""The rules between settings, checked once the records are built: authentication methods
that conflict, files that must exist, timings that must fit each other, resource names NATS
accepts, and jobs whose names or trigger subjects collide; plus the warnings for settings that
work but are fragile."""

from __future__ import annotations

import ipaddress
import os
import re
from urllib.parse import urlsplit

from hrwcron.core.config.schema import (
    BUCKET_KEYS,
    DURATIONS,
    FILE_KEYS,
    NATS_DEFAULT_MAX_PAYLOAD,
    URL_SCHEMES,
    Config,
    HttpConfig,
    NatsConfig,
    SchedulerConfig,
    TelemetryConfig,
    node_id_problem,
    redact_secrets,
    redact_url,
)
from hrwcron.core.config.values import Collector
from hrwcron.core.errors import Problem
from hrwcron.core.events import source_problem
from hrwcron.core.model import DEFAULT_MAX_LATENESS, TRIGGER_ENVELOPE, JobSpec
from hrwcron.core.passwords import hash_problem

# Same alphabet as job tags: a member's tags are matched against them.
_TAG = re.compile(r"[A-Za-z0-9_.:=-]{1,64}")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BUCKET = re.compile(r"[A-Za-z0-9_-]{1,255}")
_STREAM = re.compile(r"[!-~]{1,255}")
_STREAM_FORBIDDEN = set(".*>/\\")
_MAX_NATS_PAYLOAD = 64 * 1024 * 1024


# More holders than this is every replica holding nearly everything: use 0.
MAX_HOLDERS = 16


def _url_problem(url: str) -> str | None:
    shown = repr(redact_url(url)[:200])
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a malformed port
    except ValueError:
        return f"{shown} is not a valid URL"
    if parts.scheme not in URL_SCHEMES or "://" not in url:
        return f"{shown} must start with nats://, tls://, ws:// or wss://"
    if not parts.hostname:
        return f"{shown} has no host"
    return None


def check_nats(n: NatsConfig, c: Collector) -> None:
    if not n.servers and c.readable("nats.servers"):
        c.add("nats.servers", "must list at least one server URL")
    methods = [
        key
        for key, value in (
            ("user" if n.user else "password", n.user or n.password),
            ("token", n.token),
            ("creds", n.creds),
            ("nkey_seed", n.nkey_seed),
        )
        if value
    ]
    for i, url in enumerate(n.servers):
        problem = _url_problem(url)
        if problem:
            c.add(f"nats.servers[{i}]", problem)
        elif methods and "@" in urlsplit(url).netloc:
            c.add(
                f"nats.servers[{i}]",
                f"has credentials in the URL and nats.{methods[0]} is set too; use one place",
            )
    for key in methods[1:]:
        c.add(
            f"nats.{key}",
            f"conflicts with nats.{methods[0]}: choose one way to authenticate "
            "(user and password, token, creds or nkey_seed)",
        )
    if n.password and not n.user:
        c.add("nats.password", "needs nats.user")
    if n.user and not n.password:
        c.add("nats.user", "needs nats.password")
    if n.tls_cert and not n.tls_key:
        c.add("nats.tls_cert", "needs nats.tls_key (the certificate's private key)")
    if n.tls_key and not n.tls_cert:
        c.add("nats.tls_key", "needs nats.tls_cert")
    for key in FILE_KEYS:
        path = getattr(n, key)
        if path is not None and c.readable(f"nats.{key}"):
            shown = redact_secrets(str(path))[:200]
            if not os.path.isfile(path):
                hint = " (it looks like a secret, not a path: give the file that holds it)"
                c.add(
                    f"nats.{key}",
                    f"file not found: {shown}{hint if shown != str(path)[:200] else ''}",
                )
            elif not os.access(path, os.R_OK):
                c.add(f"nats.{key}", f"file not readable: {shown}")
    uses_tls = n.tls_ca or n.tls_cert or any(u.startswith("tls://") for u in n.servers)
    if n.tls_handshake_first and not uses_tls:
        c.add(
            "nats.tls_handshake_first",
            "needs TLS: a tls:// server URL, nats.tls_ca or nats.tls_cert",
        )
    if not n.connect_timeout > 0 and c.readable("nats.connect_timeout"):
        c.add("nats.connect_timeout", "must be more than 0 seconds")


def _positive(c: Collector, path: str, value: float, unit: str = " seconds") -> bool:
    if not c.readable(path):
        return False
    if value > 0:
        return True
    c.add(path, f"must be more than 0{unit}")
    return False


def check_scheduler(s: SchedulerConfig, c: Collector) -> None:
    # Left empty, the node id is the host name, which the process makes safe itself.
    if s.node_id and c.readable("scheduler.node_id"):
        bad_id = node_id_problem(s.node_id)
        if bad_id:
            c.add("scheduler.node_id", bad_id)
    _positive(c, "scheduler.weight", s.weight, "")
    for i, tag in enumerate(s.tags):
        if not _TAG.fullmatch(tag):
            c.add(f"scheduler.tags[{i}]", "a tag is 1-64 of letters, digits, _ . : = -")
    ok = {key: _positive(c, f"scheduler.{key}", getattr(s, key)) for key in DURATIONS["scheduler"]}
    if ok["heartbeat_interval"] and ok["member_ttl"] and s.member_ttl <= s.heartbeat_interval:
        c.add(
            "scheduler.member_ttl",
            f"must be more than heartbeat_interval ({s.heartbeat_interval:g} s), ideally twice "
            "as much, or members expire between their own heartbeats",
        )
    if ok["duplicate_window"] and ok["stream_max_age"] and s.stream_max_age < s.duplicate_window:
        c.add(
            "scheduler.stream_max_age",
            f"must be at least duplicate_window ({s.duplicate_window:g} s): "
            "JetStream cannot deduplicate beyond the messages it keeps",
        )
    if c.readable("scheduler.max_payload") and not 0 < s.max_payload <= _MAX_NATS_PAYLOAD:
        c.add("scheduler.max_payload", f"must be between 1 and {_MAX_NATS_PAYLOAD} bytes")
    if c.readable("scheduler.replicas") and not 1 <= s.replicas <= 5:
        c.add("scheduler.replicas", "must be between 1 and 5 (JetStream's limit)")
    if c.readable("scheduler.max_in_flight") and s.max_in_flight < 1:
        c.add("scheduler.max_in_flight", "must be at least 1")
    if c.readable("scheduler.holders") and not 0 <= s.holders <= MAX_HOLDERS:
        c.add(
            "scheduler.holders",
            f"must be between 0 (every replica holds every job) and {MAX_HOLDERS}",
        )
    seen: dict[str, str] = {}
    for key in BUCKET_KEYS:
        name = getattr(s, key)
        if not _BUCKET.fullmatch(name):
            c.add(f"scheduler.{key}", f"{name[:80]!r}: a bucket name is letters, digits, _ or -")
        elif name in seen:
            c.add(f"scheduler.{key}", f"{name!r} is already used by scheduler.{seen[name]}")
        else:
            seen[name] = key
    if not _STREAM.fullmatch(s.stream) or _STREAM_FORBIDDEN & set(s.stream):
        c.add(
            "scheduler.stream",
            f"{s.stream[:80]!r}: a stream name is printable ASCII without spaces, . * > / or \\",
        )
    tokens = s.subject_prefix.split(".")
    if not all(_TOKEN.fullmatch(t) for t in tokens):
        c.add(
            "scheduler.subject_prefix",
            f"{s.subject_prefix[:80]!r}: dot-separated tokens of letters, digits, _ or - "
            "(no wildcards or empty tokens)",
        )
    elif len(tokens) > 8 or len(s.subject_prefix) > 255:
        # With a job name after it, a default subject stays within the trigger subject limits.
        c.add(
            "scheduler.subject_prefix",
            f"{s.subject_prefix[:80]!r}: at most 8 tokens and 255 characters",
        )
    if s.cloudevents_source and c.readable("scheduler.cloudevents_source"):
        bad_source = source_problem(s.cloudevents_source)
        if bad_source:
            c.add("scheduler.cloudevents_source", bad_source)


def check_http(h: HttpConfig, c: Collector) -> None:
    if h.status_token is not None and len(h.status_token) < 16:
        c.add("http.status_token", "must be at least 16 characters (e.g. openssl rand -hex 16)")
    check_console_users(h, c)
    if not h.listen:
        return
    host, colon, port = h.listen.rpartition(":")
    bare_ipv6 = ":" in host and not (host.startswith("[") and host.endswith("]"))
    if not colon or not port.isdigit() or int(port) > 65535 or bare_ipv6:
        c.add(
            "http.listen",
            f"{h.listen[:80]!r}: expected HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464), "
            "or an empty string to disable",
        )


def check_telemetry(t: TelemetryConfig, c: Collector) -> None:
    if not t.service_name:
        c.add("telemetry.service_name", "must not be empty")


def check_jobs(s: SchedulerConfig, jobs: list[tuple[int, JobSpec]], c: Collector) -> None:
    names: dict[str, int] = {}
    subjects: dict[str, int] = {}
    for i, job in jobs:
        if job.name in names:
            c.add(
                f"jobs[{i}].name", f"{job.name[:80]!r} is already used by jobs[{names[job.name]}]"
            )
            continue
        names[job.name] = i
        subject = job.trigger_subject(s.subject_prefix)
        if subject in subjects:
            c.add(
                f"jobs[{i}].subject",
                f"{subject!r} is also the trigger subject of jobs[{subjects[subject]}]; "
                "each job needs its own (fencing is per subject)",
            )
        else:
            subjects[subject] = i
    if not c.readable("scheduler.duplicate_window") or s.duplicate_window <= 0:
        return
    if s.duplicate_window < DEFAULT_MAX_LATENESS:
        c.add(
            "scheduler.duplicate_window",
            f"is {s.duplicate_window:g} s; it must be at least {DEFAULT_MAX_LATENESS:g} s, the "
            "max_lateness of a job that names none (replicas refuse a trigger stream whose "
            "window is shorter)",
        )
        return
    lateness = [(job.max_lateness, i, job.name) for i, job in jobs]
    if lateness and max(lateness)[0] > s.duplicate_window:
        longest, i, name = max(lateness)
        c.add(
            "scheduler.duplicate_window",
            f"is {s.duplicate_window:g} s but jobs[{i}] ({name}) has max_lateness {longest:g} s; "
            "the window must cover every job's lateness window",
        )


def config_warnings(config: Config) -> list[Problem]:
    """Settings that work but are fragile."""
    s = config.scheduler
    found: list[Problem] = []
    if s.member_ttl < 2 * s.heartbeat_interval:
        found.append(
            Problem(
                "scheduler.member_ttl",
                f"is less than twice heartbeat_interval ({s.heartbeat_interval:g} s): one late "
                "heartbeat makes a healthy member look dead",
            )
        )
    if s.membership_refresh >= s.member_ttl:
        found.append(
            Problem(
                "scheduler.membership_refresh",
                f"is not shorter than member_ttl ({s.member_ttl:g} s): the membership view goes "
                "stale between refreshes and the replica stops claiming",
            )
        )
    if s.max_payload + TRIGGER_ENVELOPE > NATS_DEFAULT_MAX_PAYLOAD:
        found.append(
            Problem(
                "scheduler.max_payload",
                f"plus a trigger's envelope ({TRIGGER_ENVELOPE} bytes) is more than "
                f"nats-server's default max_payload ({NATS_DEFAULT_MAX_PAYLOAD} bytes): a "
                "replica refuses to start unless the server's max_payload is raised to match",
            )
        )
    if s.cloudevents_source and not s.cloudevents:
        found.append(
            Problem(
                "scheduler.cloudevents_source",
                "is set but scheduler.cloudevents is off: triggers carry no CloudEvents headers",
            )
        )
    return found


_USER_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")


def check_console_users(h: HttpConfig, c: Collector) -> None:
    """The console's sign-in: users as NAME:HASH (the hash is never quoted), and a trusted
    header only together with the proxies allowed to set it."""
    if not c.readable("http.users"):
        return
    seen: set[str] = set()
    for i, entry in enumerate(h.users):
        name, colon, encoded = entry.partition(":")
        where = f"http.users[{i}]"
        if not colon or not _USER_NAME.fullmatch(name):
            c.add(where, "expected NAME:HASH, NAME 1-64 letters, digits, '_', '.', '@' or '-'")
            continue
        if name in seen:
            c.add(where, f"user {name!r} is listed twice")
        seen.add(name)
        problem = hash_problem(encoded)
        if problem:
            c.add(where, f"the hash of {name!r} {problem}")
    if h.trusted_header and not _HEADER_NAME.fullmatch(h.trusted_header):
        c.add("http.trusted_header", "must be a header name such as X-Forwarded-User")
    if h.trusted_header and not h.trusted_proxies:
        c.add(
            "http.trusted_header",
            "needs http.trusted_proxies: the addresses of the proxies allowed to set it",
        )
    for i, address in enumerate(h.trusted_proxies):
        try:
            ipaddress.ip_address(address)
        except ValueError:
            c.add(f"http.trusted_proxies[{i}]", f"{address[:80]!r} is not an IP address")
