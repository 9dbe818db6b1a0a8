"""Service configuration: a TOML file, overlaid with ``HRWCRON_*`` environment variables.

Loading never stops at the first mistake: every problem is collected with a dotted location
(``scheduler.member_ttl``, ``jobs[2].schedule``, ``nats.servers[0]``) so an operator fixes a
file in one round trip. Secrets (passwords, tokens, credentials inside server URLs) never reach
``repr()``, ``str()`` or an error message.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import math
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

import msgspec

from hrwcron.core.errors import ConfigError, Problem, ScheduleError
from hrwcron.core.model import (
    DEFAULT_MAX_LATENESS,
    DEFAULT_MAX_PAYLOAD,
    DEFAULT_SUBJECT_PREFIX,
    TRIGGER_ENVELOPE,
    JobSpec,
)
from hrwcron.core.schedule import parse_duration

MASK = "***"
ENV_PREFIX = "HRWCRON_"
# Names the config file for commands that take it from the environment; not a setting itself.
ENV_CONFIG_PATH = "HRWCRON_CONFIG"
# Arms failpoints for fault-injection tests (see hrwcron.engine.failpoints); not a setting.
FAILPOINTS_ENV = "HRWCRON_FAILPOINTS"
# Read by other parts of the process, not settings.
_ENV_NOT_SETTINGS = frozenset({ENV_CONFIG_PATH, FAILPOINTS_ENV})
DEFAULT_SERVER = "nats://127.0.0.1:4222"
URL_SCHEMES = ("nats", "tls", "ws", "wss")

NODE_ID_RULE = "a node id is 1-64 letters, digits, '_' or '-'"
_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOT_NODE_ID = re.compile(r"[^A-Za-z0-9_-]+")
# Same alphabet as job tags: a member's tags are matched against them.
_TAG = re.compile(r"[A-Za-z0-9_.:=-]{1,64}")
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_BUCKET = re.compile(r"[A-Za-z0-9_-]{1,255}")
_STREAM = re.compile(r"[!-~]{1,255}")
_STREAM_FORBIDDEN = set(".*>/\\")
_MAX_NATS_PAYLOAD = 64 * 1024 * 1024
NATS_DEFAULT_MAX_PAYLOAD = 1024 * 1024
_TOML_POSITION = re.compile(r"\s*\(at (line \d+, column \d+|end of document)\)$")

Storage = Literal["file", "memory"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]


def redact_url(url: str) -> str:
    """``url`` with the password (or a bare token) in its user-info replaced by ``***``.

    Parsing is deliberately naive: it must also mask strings that are not valid URLs, since
    those are exactly the ones that end up in error messages. Everything before the last ``@``
    is treated as user-info, which masks too much rather than too little.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    # A user-info without ':' is a token (nats://TOKEN@host), so it is the secret itself.
    masked = f"{user}:{MASK}" if colon else MASK
    return f"{scheme}{sep}{masked}@{host}"


def default_node_id(hostname: str | None = None) -> str:
    """The host name made safe for a KV key: runs of other characters become ``-``."""
    name = socket.gethostname() if hostname is None else hostname
    cleaned = _NOT_NODE_ID.sub("-", name).strip("-")[:64].rstrip("-")
    return cleaned or "hrwcron"


def node_id_problem(node_id: str) -> str | None:
    """Why ``node_id`` cannot be a member id, or None when it can."""
    if _NODE_ID.fullmatch(node_id):
        return None
    return f"{node_id[:80]!r} is not a valid node id; {NODE_ID_RULE}"


class NatsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """How to reach NATS. File paths are resolved against the config file's directory."""

    servers: list[str] = msgspec.field(default_factory=lambda: [DEFAULT_SERVER])
    user: str | None = None
    password: str | None = None
    token: str | None = None
    creds: str | None = None
    nkey_seed: str | None = None
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_handshake_first: bool = False
    connect_timeout: float = 2.0
    name: str = "hrwcron"

    def redacted(self) -> dict[str, Any]:
        data: dict[str, Any] = msgspec.structs.asdict(self)
        data["servers"] = [redact_url(url) for url in self.servers]
        for key in _SECRET_KEYS:
            if data[key] is not None:
                data[key] = MASK
        return data

    def __repr__(self) -> str:
        return _repr(self, self.redacted())

    def __rich_repr__(self) -> list[tuple[str, Any]]:
        return list(self.redacted().items())


_SECRET_KEYS = ("password", "token")


class SchedulerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """The replica's identity, timings and NATS resource names. Durations are seconds."""

    node_id: str = ""
    weight: float = 1.0
    tags: list[str] = msgspec.field(default_factory=list)
    heartbeat_interval: float = 1.0
    member_ttl: float = 3.0
    failover_step: float = 1.0
    claim_lease: float = 2.0
    max_clock_skew: float = 1.0
    max_payload: int = DEFAULT_MAX_PAYLOAD
    membership_refresh: float = 1.0
    members_bucket: str = "hrwcron_members"
    claims_bucket: str = "hrwcron_claims"
    jobs_bucket: str = "hrwcron_jobs"
    runs_bucket: str = "hrwcron_runs"
    counts_bucket: str = "hrwcron_counts"
    stream: str = "HRWCRON_TRIGGERS"
    subject_prefix: str = DEFAULT_SUBJECT_PREFIX
    replicas: int = 1
    storage: Storage = "file"
    # Claims only stop replicas from doing the same work twice: the trigger stream's Msg-Id
    # and subject-sequence fencing are what stop a duplicate, so claims need no disk.
    claims_storage: Storage = "memory"
    duplicate_window: float = 600.0
    stream_max_age: float = 86400.0
    apply_jobs: bool = True
    shutdown_timeout: float = 5.0
    max_in_flight: int = 512
    per_job_metrics: bool = True

    @property
    def stream_subjects(self) -> str:
        return f"{self.subject_prefix}.>"


class HttpConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Health, metrics and admin endpoint; an empty ``listen`` disables it."""

    listen: str = "127.0.0.1:9464"


class TelemetryConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Logging and tracing; span export is configured through the standard OTEL_* variables."""

    log_format: LogFormat = "text"
    log_level: LogLevel = "info"
    traces: bool = False
    service_name: str = "hrwcron"


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """A complete, validated configuration. Build it with :func:`load_config`."""

    nats: NatsConfig = msgspec.field(default_factory=NatsConfig)
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    http: HttpConfig = msgspec.field(default_factory=HttpConfig)
    telemetry: TelemetryConfig = msgspec.field(default_factory=TelemetryConfig)
    jobs: list[JobSpec] = msgspec.field(default_factory=list)

    def redacted(self) -> dict[str, Any]:
        """Plain data safe to log or serve: secrets masked."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        data["nats"] = self.nats.redacted()
        return data


def _repr(obj: msgspec.Struct, data: Mapping[str, Any]) -> str:
    inner = ", ".join(f"{k}={v!r}" for k, v in data.items())
    return f"{type(obj).__name__}({inner})"


class ConfigFileError(ConfigError):
    """A ConfigError that knows which file (or ``environment``) it is about."""

    def __init__(self, problems: Sequence[Problem], source: str) -> None:
        super().__init__(problems)
        self.source = source

    def lines(self) -> list[str]:
        """One ``SOURCE: where: message`` line per problem."""
        return [f"{self._origin(p)}: {p}" for p in self.problems]

    def _origin(self, problem: Problem) -> str:
        return "environment" if problem.where.startswith(ENV_PREFIX) else self.source

    def __str__(self) -> str:
        return "; ".join(self.lines())


_SECTIONS: dict[str, type[msgspec.Struct]] = {
    "nats": NatsConfig,
    "scheduler": SchedulerConfig,
    "http": HttpConfig,
    "telemetry": TelemetryConfig,
}
# Float settings that also accept duration strings such as "90s" or "5m".
_DURATIONS: dict[str, tuple[str, ...]] = {
    "nats": ("connect_timeout",),
    "scheduler": (
        "heartbeat_interval",
        "member_ttl",
        "failover_step",
        "claim_lease",
        "max_clock_skew",
        "membership_refresh",
        "duplicate_window",
        "stream_max_age",
        "shutdown_timeout",
    ),
    "http": (),
    "telemetry": (),
    "jobs": ("max_lateness", "jitter", "delete_after"),
}
_SECRET_PATHS = frozenset(f"nats.{k}" for k in _SECRET_KEYS)
_FILE_KEYS = ("creds", "nkey_seed", "tls_ca", "tls_cert", "tls_key")
_BUCKET_KEYS = ("members_bucket", "claims_bucket", "jobs_bucket", "runs_bucket", "counts_bucket")
_ENV_ALIASES: dict[str, tuple[str, str]] = {
    "HRWCRON_NATS_URL": ("nats", "servers"),
    "HRWCRON_NODE_ID": ("scheduler", "node_id"),
    "HRWCRON_LOG_LEVEL": ("telemetry", "log_level"),
    "HRWCRON_LOG_FORMAT": ("telemetry", "log_format"),
}


def _env_names() -> dict[str, tuple[str, str]]:
    names = {
        f"{ENV_PREFIX}{section.upper()}_{f.name.upper()}": (section, f.name)
        for section, struct in _SECTIONS.items()
        for f in msgspec.structs.fields(struct)
    }
    names.update(_ENV_ALIASES)
    return names


_ENV_NAMES = _env_names()


class _Bad(Exception):
    """Conversion failures of one value: (location suffix, message) pairs."""

    def __init__(self, *items: tuple[str, str]) -> None:
        super().__init__(items)
        self.items = items


def _bad(message: str, suffix: str = "") -> _Bad:
    return _Bad((suffix, message))


def _kind(value: object) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"


def _shown(value: object, secret: bool) -> str:
    if secret:
        return _kind(value)
    if isinstance(value, str):
        return f"a string ({redact_url(value)[:80]!r})"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"{_kind(value)} ({value!r})"
    return _kind(value)


def _duration(value: str) -> float:
    try:
        return float(parse_duration(value))
    except ScheduleError as exc:
        raise _bad("; ".join(p.message for p in exc.problems)) from None


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def _coerce(value: Any, typ: Any, *, duration: bool, from_env: bool, secret: bool) -> Any:
    """``value`` as ``typ``. File values must already have the right TOML type; environment
    values are strings and are parsed."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if typ is Any:
        return value
    if origin is Literal:
        if value in args and isinstance(value, str):
            return value
        choices = ", ".join(repr(a) for a in args)
        raise _bad(f"must be one of {choices}, got {_shown(value, secret)}")
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        if from_env and value == "":
            return None
        (inner,) = (a for a in args if a is not type(None))
        return _coerce(value, inner, duration=duration, from_env=from_env, secret=secret)
    if origin is list:
        return _coerce_list(value, args[0], from_env=from_env, secret=secret)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if from_env and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise _bad(f"expected true or false, got {_shown(value, secret)}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_env:
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise _bad(f"expected an integer, got {_shown(value, secret)}")
    if typ is float:
        return _coerce_float(value, duration=duration, from_env=from_env, secret=secret)
    if typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, datetime.date | datetime.time):
            # A TOML date or date-time written without quotes (start, end, exclude): the same
            # text in ISO form, so it is validated like a quoted one.
            return value.isoformat()
        raise _bad(f"expected a string, got {_shown(value, secret)}")
    raise TypeError(f"no conversion to {typ!r}")  # a new field type needs a branch above


def _coerce_list(value: Any, item: Any, *, from_env: bool, secret: bool) -> list[Any]:
    if from_env:
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list):
        raise _bad(f"expected an array, got {_shown(value, secret)}")
    out: list[Any] = []
    failed: list[tuple[str, str]] = []
    for i, element in enumerate(value):
        try:
            out.append(_coerce(element, item, duration=False, from_env=from_env, secret=secret))
        except _Bad as exc:
            failed.extend((f"[{i}]{suffix}", message) for suffix, message in exc.items)
    if failed:
        raise _Bad(*failed)
    return out


def _coerce_float(value: Any, *, duration: bool, from_env: bool, secret: bool) -> float:
    expected = "seconds or a duration like '90s' or '5m'" if duration else "a number"
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        if from_env:
            with contextlib.suppress(ValueError):
                number = float(value.strip())
        if number is None and duration:
            number = _duration(value)
    if number is None:
        raise _bad(f"expected {expected}, got {_shown(value, secret)}")
    if not math.isfinite(number):
        raise _bad("must be a finite number")
    return number


class _Collector:
    """Problems found so far, the locations whose value could not be read (so checks that
    depend on them stay quiet instead of piling up follow-on errors) and where values came from
    when not from the file."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.bad: set[str] = set()
        self.origin: dict[str, str] = {}

    def add(self, where: str, message: str) -> None:
        setter = self.origin.get(re.sub(r"\[\d+\].*$", "", where))
        if setter:
            message = f"{message} (set by {setter})"
        self.problems.append(Problem(where, message))

    def fail(self, where: str, exc: _Bad) -> None:
        self.bad.add(where)
        for suffix, message in exc.items:
            self.add(where + suffix, message)

    def readable(self, *paths: str) -> bool:
        return not any(p in self.bad for p in paths)


def _unknown(key: str, known: Sequence[str], what: str = "key") -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(known))}"
    return f"unknown {what}{hint}"


def _read_table(
    struct: type[msgspec.Struct], raw: object, where: str, durations: tuple[str, ...], c: _Collector
) -> dict[str, Any]:
    if not isinstance(raw, dict):
        c.fail(where, _bad(f"must be a table, got {_kind(raw)}"))
        return {}
    fields = {f.name: f for f in msgspec.structs.fields(struct)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"{where}.{key}"
        field = fields.get(key)
        if field is None:
            c.add(path, _unknown(key, list(fields)))
            continue
        secret = path in _SECRET_PATHS
        try:
            values[key] = _coerce(
                value, field.type, duration=key in durations, from_env=False, secret=secret
            )
        except _Bad as exc:
            c.fail(path, exc)
    return values


def _read_nats(raw: object, c: _Collector) -> dict[str, Any]:
    if isinstance(raw, dict) and "url" in raw:
        raw = dict(raw)
        url = raw.pop("url")
        if "servers" in raw:
            c.add("nats.url", "set either nats.url or nats.servers, not both")
        elif isinstance(url, str):
            raw["servers"] = [part.strip() for part in url.split(",") if part.strip()]
            c.origin["nats.servers"] = "nats.url"
        else:
            c.fail("nats.url", _bad(f"expected a comma-separated string, got {_kind(url)}"))
    return _read_table(NatsConfig, raw, "nats", _DURATIONS["nats"], c)


def _resolve_files(values: dict[str, Any], base_dir: str | None) -> None:
    for key in _FILE_KEYS:
        path = values.get(key)
        if isinstance(path, str) and path:
            path = os.path.expanduser(path)
            if base_dir is not None and not os.path.isabs(path):
                path = os.path.normpath(os.path.join(base_dir, path))
            values[key] = path


def _read_jobs(raw: object, c: _Collector) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        c.fail("jobs", _bad(f"must be an array of tables ([[jobs]]), got {_kind(raw)}"))
        return []
    required = [
        f.name
        for f in msgspec.structs.fields(JobSpec)
        if f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
    ]
    jobs: list[dict[str, Any]] = []
    for i, table in enumerate(raw):
        where = f"jobs[{i}]"
        values = _read_table(JobSpec, table, where, _DURATIONS["jobs"], c)
        if isinstance(table, dict):
            for name in required:
                if name not in table:
                    c.fail(f"{where}.{name}", _bad("is required"))
        jobs.append(values)
    return jobs


def _apply_env(values: dict[str, dict[str, Any]], env: Mapping[str, str], c: _Collector) -> None:
    chosen: dict[tuple[str, str], str] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var in _ENV_NOT_SETTINGS:
            continue
        target = _ENV_NAMES.get(var)
        if target is None:
            c.add(var, _unknown(var, [*_ENV_NAMES, ENV_CONFIG_PATH], "variable"))
            continue
        section, key = target
        path = f"{section}.{key}"
        earlier = chosen.get(target)
        if earlier is not None:
            if env[earlier] != env[var]:
                c.add(var, f"conflicts with {earlier} (both set {path}); set only one")
            continue
        chosen[target] = var
        fields = msgspec.structs.fields(_SECTIONS[section])
        typ = next(f.type for f in fields if f.name == key)
        try:
            value = _coerce(
                env[var],
                typ,
                duration=key in _DURATIONS[section],
                from_env=True,
                secret=path in _SECRET_PATHS,
            )
        except _Bad as exc:
            for suffix, message in exc.items:
                c.add(var, f"{message} (for {path}{suffix})")
            c.bad.add(path)
            continue
        values[section][key] = value
        c.origin[path] = var
        c.bad.discard(path)


def parse_config(
    text: str,
    source: str,
    env: Mapping[str, str],
    *,
    base_dir: str | None = None,
) -> Config:
    """A Config from TOML ``text`` overlaid with ``env``; raises ConfigFileError listing every
    problem. ``source`` names the text in messages; relative file paths in it are resolved
    against ``base_dir`` (the working directory when None)."""
    c = _Collector()
    try:
        raw: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_POSITION.search(message)
        where = found.group(1) if found else ""
        detail = message[: found.start()] if found else message
        raise ConfigFileError([Problem(where, f"invalid TOML: {detail}")], source) from None
    except RecursionError:
        problem = Problem("", "invalid TOML: arrays or tables nested too deeply")
        raise ConfigFileError([problem], source) from None
    return _build(raw, source, env, base_dir, c)


def load_config(path: str | None, env: Mapping[str, str]) -> Config:
    """The Config in the TOML file at ``path`` (defaults when None), overlaid with ``env``."""
    if path is None:
        return _build({}, "environment", env, None, _Collector())
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigFileError([Problem("", f"cannot read: {exc.strerror}")], path) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = Problem("", f"not UTF-8 text (byte {exc.start})")
        raise ConfigFileError([problem], path) from None
    return parse_config(text, path, env, base_dir=os.path.dirname(os.path.abspath(path)))


def _build(
    raw: dict[str, Any], source: str, env: Mapping[str, str], base_dir: str | None, c: _Collector
) -> Config:
    values: dict[str, dict[str, Any]] = {}
    for key in raw:
        if key not in _SECTIONS and key != "jobs":
            c.add(key, _unknown(key, [*_SECTIONS, "jobs"], "section"))
    values["nats"] = _read_nats(raw.get("nats", {}), c)
    _resolve_files(values["nats"], base_dir)
    for section in ("scheduler", "http", "telemetry"):
        struct = _SECTIONS[section]
        values[section] = _read_table(struct, raw.get(section, {}), section, _DURATIONS[section], c)
    job_values = _read_jobs(raw.get("jobs", []), c)
    _apply_env(values, env, c)
    _resolve_files(values["nats"], None)

    scheduler = SchedulerConfig(**values["scheduler"])
    if not scheduler.node_id:
        scheduler = msgspec.structs.replace(scheduler, node_id=default_node_id())
    jobs = _make_jobs(job_values, scheduler, c)
    config = Config(
        nats=NatsConfig(**values["nats"]),
        scheduler=scheduler,
        http=HttpConfig(**values["http"]),
        telemetry=TelemetryConfig(**values["telemetry"]),
        jobs=[job for _, job in jobs],
    )
    _check_nats(config.nats, c)
    _check_scheduler(config.scheduler, c)
    _check_http(config.http, c)
    _check_telemetry(config.telemetry, c)
    _check_jobs(config.scheduler, jobs, c)
    if c.problems:
        raise ConfigFileError(sorted(c.problems, key=_file_order), source)
    return config


_SECTION_ORDER = {name: i for i, name in enumerate(["nats", "scheduler", "http", "telemetry"], 1)}


def _file_order(problem: Problem) -> tuple[int, int]:
    """Sections in the order of the file's documentation, jobs by index, variables last; the
    sort is stable, so problems of one place keep the order they were found in."""
    where = problem.where
    if where.startswith(ENV_PREFIX):
        return (9, 0)
    job = re.match(r"jobs\[(\d+)\]", where)
    if job:
        return (5, int(job.group(1)))
    return (_SECTION_ORDER.get(re.split(r"[.\[]", where, maxsplit=1)[0], 0), 0)


def _make_jobs(
    job_values: list[dict[str, Any]], scheduler: SchedulerConfig, c: _Collector
) -> list[tuple[int, JobSpec]]:
    """Jobs that could be built, with their index in the file, after checking each one's own
    rules (fields that failed to convert keep their defaults and are not re-reported)."""
    jobs: list[tuple[int, JobSpec]] = []
    check_rules = c.readable("scheduler.subject_prefix", "scheduler.max_payload")
    for i, values in enumerate(job_values):
        where = f"jobs[{i}]"
        if not c.readable(where, f"{where}.name", f"{where}.schedule"):
            continue
        job = JobSpec(**values)
        jobs.append((i, job))
        if not check_rules:
            continue
        for p in job.problems(prefix=scheduler.subject_prefix, max_payload=scheduler.max_payload):
            head = re.split(r"[.\[]", p.where, maxsplit=1)[0]
            if c.readable(f"{where}.{head}"):
                c.add(f"{where}.{p.where}" if p.where else where, p.message)
    return jobs


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


def _check_nats(n: NatsConfig, c: _Collector) -> None:
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
    for key in _FILE_KEYS:
        path = getattr(n, key)
        if path is not None and c.readable(f"nats.{key}"):
            if not os.path.isfile(path):
                c.add(f"nats.{key}", f"file not found: {path}")
            elif not os.access(path, os.R_OK):
                c.add(f"nats.{key}", f"file not readable: {path}")
    uses_tls = n.tls_ca or n.tls_cert or any(u.startswith("tls://") for u in n.servers)
    if n.tls_handshake_first and not uses_tls:
        c.add(
            "nats.tls_handshake_first",
            "needs TLS: a tls:// server URL, nats.tls_ca or nats.tls_cert",
        )
    if not n.connect_timeout > 0 and c.readable("nats.connect_timeout"):
        c.add("nats.connect_timeout", "must be more than 0 seconds")


def _positive(c: _Collector, path: str, value: float, unit: str = " seconds") -> bool:
    if not c.readable(path):
        return False
    if value > 0:
        return True
    c.add(path, f"must be more than 0{unit}")
    return False


def _check_scheduler(s: SchedulerConfig, c: _Collector) -> None:
    if c.readable("scheduler.node_id"):
        bad_id = node_id_problem(s.node_id)
        if bad_id:
            c.add("scheduler.node_id", bad_id)
    _positive(c, "scheduler.weight", s.weight, "")
    for i, tag in enumerate(s.tags):
        if not _TAG.fullmatch(tag):
            c.add(f"scheduler.tags[{i}]", "a tag is 1-64 of letters, digits, _ . : = -")
    ok = {key: _positive(c, f"scheduler.{key}", getattr(s, key)) for key in _DURATIONS["scheduler"]}
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
    seen: dict[str, str] = {}
    for key in _BUCKET_KEYS:
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


def _check_http(h: HttpConfig, c: _Collector) -> None:
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


def _check_telemetry(t: TelemetryConfig, c: _Collector) -> None:
    if not t.service_name:
        c.add("telemetry.service_name", "must not be empty")


def _check_jobs(s: SchedulerConfig, jobs: list[tuple[int, JobSpec]], c: _Collector) -> None:
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
    return found
