"""The settings records a configuration becomes, and the facts about them every other step
needs: defaults, which keys are durations, secrets or file paths, and how secrets are masked.

Secrets (passwords, tokens, credentials inside server URLs) never reach ``repr()``, ``str()``
or an error message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from hrwcron.core import resources
from hrwcron.core.errors import ConfigError, Problem
from hrwcron.core.events import default_source
from hrwcron.core.model import DEFAULT_MAX_PAYLOAD, JobSpec

MASK = "***"
ENV_PREFIX = "HRWCRON_"
# Names the config file for commands that take it from the environment; not a setting itself.
ENV_CONFIG_PATH = "HRWCRON_CONFIG"
# Arms failpoints for fault-injection tests (see hrwcron.engine.failpoints); not a setting.
FAILPOINTS_ENV = "HRWCRON_FAILPOINTS"
DEFAULT_SERVER = "nats://127.0.0.1:4222"
URL_SCHEMES = ("nats", "tls", "ws", "wss")

NODE_ID_RULE = "a node id is 1-64 letters, digits, '_' or '-'"
_NODE_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
_NOT_NODE_ID = re.compile(r"[^A-Za-z0-9_-]+")
NATS_DEFAULT_MAX_PAYLOAD = 1024 * 1024

Storage = Literal["file", "memory"]
LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]


# Shapes of secrets that may turn up where they do not belong (a seed pasted into a variable
# that expects a file path, a creds file's contents in an error): an NKEY seed (S + the key
# type + 56 base32 characters), a JWT, a PEM or creds block.
_SECRET_SHAPES = re.compile(
    r"S[UAONCPX][A-Z2-7]{50,}"
    r"|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*)?"
    r"|-----BEGIN[^-]*-----.*?(?:-----END[^-]*-----|$)",
    re.DOTALL,
)


def redact_secrets(text: str) -> str:
    """``text`` with anything shaped like an NKEY seed, a JWT or a PEM/creds block replaced by
    ``***``: for error messages and log lines that quote a value someone gave."""
    return _SECRET_SHAPES.sub("***", text)


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


def default_node_id(hostname: str) -> str:
    """The host name made safe for a KV key: runs of other characters become ``-``.

    A configuration without a node id leaves it empty; the process fills it in from the name
    of the host it runs on (see :mod:`hrwcron.process.host`), so the core never asks the
    machine.
    """
    cleaned = _NOT_NODE_ID.sub("-", hostname).strip("-")[:64].rstrip("-")
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
    members_bucket: str = resources.MEMBERS_BUCKET
    claims_bucket: str = resources.CLAIMS_BUCKET
    jobs_bucket: str = resources.JOBS_BUCKET
    runs_bucket: str = resources.RUNS_BUCKET
    counts_bucket: str = resources.COUNTS_BUCKET
    stream: str = resources.TRIGGER_STREAM
    subject_prefix: str = resources.SUBJECT_PREFIX
    replicas: int = 1
    storage: Storage = "file"
    # Claims only stop replicas from doing the same work twice: the trigger stream's Msg-Id
    # and subject-sequence fencing are what stop a duplicate, so claims need no disk.
    claims_storage: Storage = "memory"
    duplicate_window: float = 600.0
    stream_max_age: float = 86400.0
    apply_jobs: bool = True
    shutdown_timeout: float = 5.0
    # How long start-up retries what an election or a booting cluster answers (no responders,
    # temporarily unavailable, timeouts) before it gives up; longer than a JetStream election.
    startup_timeout: float = 60.0
    max_in_flight: int = 512
    # Replicas that hold each lane of jobs, the owner and who takes over (core/partitions.py):
    # each replica holds about holders/N of the jobs. 0: every replica holds every job.
    # The same on every replica.
    holders: int = 0
    per_job_metrics: bool = True
    # CloudEvents headers on every trigger (binary mode of the NATS binding); off, a trigger
    # carries none and costs nothing more.
    cloudevents: bool = False
    # Their ce-source; empty: derived from subject_prefix (see events_source).
    cloudevents_source: str = ""

    @property
    def stream_subjects(self) -> str:
        return f"{self.subject_prefix}.>"

    @property
    def events_source(self) -> str:
        """The ce-source triggers carry, empty when CloudEvents headers are off."""
        if not self.cloudevents:
            return ""
        return self.cloudevents_source or default_source(self.subject_prefix)

    @property
    def marks_subject(self) -> str:
        """Where replicas announce their progress marks: core NATS, never stored; one subject
        per deployment (its members bucket), so two deployments on one account stay apart."""
        base = f"{resources.MARKS_SUBJECT_PREFIX}.{self.members_bucket}"
        # Holding shares, replicas rank each job among its lane's holders: their marks must
        # never reach a replica that ranks among every member (another setting, an older
        # version), which would take them for marks about jobs their owner does not hold.
        return f"{base}.holders{self.holders}" if self.holders > 0 else base


class HttpConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True, frozen=True):
    """Health, metrics, status and the console; an empty ``listen`` disables it. With
    ``status_token`` set, the console and ``/status`` (job specs and payload previews) answer
    only a request that presents it (HTTP Basic password or Bearer token) or a signed-in
    user; probes and ``/metrics`` stay open.

    The console acts (pause, resume, trigger, backfill, delete) only for a signed-in user:
    one of ``users`` (``NAME:HASH``, the hash from ``hrwcron hash-password``), or whoever a
    reverse proxy at one of ``trusted_proxies`` names in the ``trusted_header``."""

    listen: str = "127.0.0.1:9464"
    status_token: str | None = None
    users: list[str] = msgspec.field(default_factory=list)
    trusted_header: str = ""
    trusted_proxies: list[str] = msgspec.field(default_factory=list)

    def redacted(self) -> dict[str, Any]:
        data: dict[str, Any] = msgspec.structs.asdict(self)
        if data["status_token"] is not None:
            data["status_token"] = MASK
        data["users"] = [f"{user.partition(':')[0]}:{MASK}" for user in self.users]
        return data

    def __repr__(self) -> str:
        return _repr(self, self.redacted())


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
        data["http"] = self.http.redacted()
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


SECTIONS: dict[str, type[msgspec.Struct]] = {
    "nats": NatsConfig,
    "scheduler": SchedulerConfig,
    "http": HttpConfig,
    "telemetry": TelemetryConfig,
}
# Float settings that also accept duration strings such as "90s" or "5m".
DURATIONS: dict[str, tuple[str, ...]] = {
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
        "startup_timeout",
    ),
    "http": (),
    "telemetry": (),
    "jobs": ("max_lateness", "jitter", "delete_after"),
}
SECRET_PATHS = frozenset([*(f"nats.{k}" for k in _SECRET_KEYS), "http.status_token", "http.users"])
FILE_KEYS = ("creds", "nkey_seed", "tls_ca", "tls_cert", "tls_key")
BUCKET_KEYS = ("members_bucket", "claims_bucket", "jobs_bucket", "runs_bucket", "counts_bucket")
