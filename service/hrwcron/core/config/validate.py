"""From the raw TOML mapping (and the environment overlay) to a checked :class:`Config`.

Each section's table is read key by key into typed values, the environment is laid over them,
the records are built, and then the rules between settings are checked (see
:mod:`hrwcron.core.config.checks`). Every problem is collected with its dotted location; a
value that could not be read keeps its default and is not reported again by later checks.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from hrwcron.core.config.checks import (
    check_http,
    check_jobs,
    check_nats,
    check_scheduler,
    check_telemetry,
)
from hrwcron.core.config.environment import overlay_environment
from hrwcron.core.config.schema import (
    DURATIONS,
    ENV_PREFIX,
    FILE_KEYS,
    SECRET_PATHS,
    SECTIONS,
    Config,
    ConfigFileError,
    HttpConfig,
    NatsConfig,
    SchedulerConfig,
    TelemetryConfig,
)
from hrwcron.core.config.values import Bad, Collector, coerce, kind, unknown, unusable
from hrwcron.core.errors import Problem
from hrwcron.core.model import JobSpec


def build_config(
    raw: dict[str, Any], source: str, env: Mapping[str, str], base_dir: str | None
) -> Config:
    """The Config that ``raw`` (a parsed TOML document) overlaid with ``env`` describes; raises
    ConfigFileError listing every problem, in file order, naming ``source``."""
    c = Collector()
    values: dict[str, dict[str, Any]] = {}
    for key in raw:
        if key not in SECTIONS and key != "jobs":
            c.add(key, unknown(key, [*SECTIONS, "jobs"], "section"))
    values["nats"] = _read_nats(raw.get("nats", {}), c)
    _resolve_files(values["nats"], base_dir)
    for section in ("scheduler", "http", "telemetry"):
        struct = SECTIONS[section]
        values[section] = _read_table(struct, raw.get(section, {}), section, DURATIONS[section], c)
    job_values = _read_jobs(raw.get("jobs", []), c)
    overlay_environment(values, env, c)
    _resolve_files(values["nats"], None)

    scheduler = SchedulerConfig(**values["scheduler"])
    jobs = _make_jobs(job_values, scheduler, c)
    config = Config(
        nats=NatsConfig(**values["nats"]),
        scheduler=scheduler,
        http=HttpConfig(**values["http"]),
        telemetry=TelemetryConfig(**values["telemetry"]),
        jobs=[job for _, job in jobs],
    )
    check_nats(config.nats, c)
    check_scheduler(config.scheduler, c)
    check_http(config.http, c)
    check_telemetry(config.telemetry, c)
    check_jobs(config.scheduler, jobs, c)
    if c.problems:
        raise ConfigFileError(sorted(c.problems, key=_file_order), source)
    return config


def _read_table(
    struct: type[msgspec.Struct], raw: object, where: str, durations: tuple[str, ...], c: Collector
) -> dict[str, Any]:
    if not isinstance(raw, dict):
        c.fail(where, unusable(f"must be a table, got {kind(raw)}"))
        return {}
    fields = {f.name: f for f in msgspec.structs.fields(struct)}
    values: dict[str, Any] = {}
    for key, value in raw.items():
        path = f"{where}.{key}"
        field = fields.get(key)
        if field is None:
            c.add(path, unknown(key, list(fields)))
            continue
        secret = path in SECRET_PATHS
        try:
            values[key] = coerce(
                value, field.type, duration=key in durations, from_env=False, secret=secret
            )
        except Bad as exc:
            c.fail(path, exc)
    return values


def _read_nats(raw: object, c: Collector) -> dict[str, Any]:
    if isinstance(raw, dict) and "url" in raw:
        raw = dict(raw)
        url = raw.pop("url")
        if "servers" in raw:
            c.add("nats.url", "set either nats.url or nats.servers, not both")
        elif isinstance(url, str):
            raw["servers"] = [part.strip() for part in url.split(",") if part.strip()]
            c.origin["nats.servers"] = "nats.url"
        else:
            c.fail("nats.url", unusable(f"expected a comma-separated string, got {kind(url)}"))
    return _read_table(NatsConfig, raw, "nats", DURATIONS["nats"], c)


def _resolve_files(values: dict[str, Any], base_dir: str | None) -> None:
    for key in FILE_KEYS:
        path = values.get(key)
        if isinstance(path, str) and path:
            path = os.path.expanduser(path)
            if base_dir is not None and not os.path.isabs(path):
                path = os.path.normpath(os.path.join(base_dir, path))
            values[key] = path


def _read_jobs(raw: object, c: Collector) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        c.fail("jobs", unusable(f"must be an array of tables ([[jobs]]), got {kind(raw)}"))
        return []
    required = [
        f.name
        for f in msgspec.structs.fields(JobSpec)
        if f.default is msgspec.NODEFAULT and f.default_factory is msgspec.NODEFAULT
    ]
    jobs: list[dict[str, Any]] = []
    for i, table in enumerate(raw):
        where = f"jobs[{i}]"
        values = _read_table(JobSpec, table, where, DURATIONS["jobs"], c)
        if isinstance(table, dict):
            for name in required:
                if name not in table:
                    c.fail(f"{where}.{name}", unusable("is required"))
        jobs.append(values)
    return jobs


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
    job_values: list[dict[str, Any]], scheduler: SchedulerConfig, c: Collector
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
