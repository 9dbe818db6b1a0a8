"""Operator commands at N jobs: ``hrwcron apply`` of N new jobs, a no-change apply, an apply
that changes 1% of them, ``hrwcron jobs ls`` and the first screen of ``hrwcron status``, each a
``python -m hrwcron`` process timed from spawn to exit against 3 replicas, as a person runs them.

The floor, measured in the same run: one process writing the same N job specs into a KV bucket
configured like the jobs bucket, as fast as it can (pipelined puts, the best of two ways).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
from nats.js.api import KeyValueConfig, StorageType

from hrwcron.adapters.jetstream.kv import conditional_writes
from hrwcron.adapters.jetstream.pipeline import JetStreamPipeline
from hrwcron.core.model import JobSpec, encode

from .common import ROOT, Deployment, Fleet, connect, fmt, gather_limited, ratio, until

JITTER_S = 3600.0
FLOOR_BUCKET = "bench_floor"
CHANGED_SHARE = 100  # one job in this many changes in the "1% changed" apply
# Targets of issue 15, stated for 100,000 jobs.
TARGETS = {
    "apply_new": 30.0,
    "no_change": 10.0,
    "ls": 10.0,
    "status": 1.0,
}
FLOOR_RATIO = 3.0


@dataclass
class Command:
    what: str
    argv: list[str]
    seconds: float = math.nan
    exit_code: int | None = None
    last_line: str = ""


@dataclass
class OperatorResult:
    jobs: int
    deployment: str
    floors: dict[str, float] = field(default_factory=dict)
    commands: dict[str, Command] = field(default_factory=dict)
    loaded_s: float = math.nan  # after the first apply returned, until every replica runs all

    @property
    def floor_s(self) -> float:
        return min(self.floors.values(), default=math.nan)

    def seconds(self, key: str) -> float:
        command = self.commands.get(key)
        return command.seconds if command and command.exit_code == 0 else math.nan


def specs(count: int) -> list[JobSpec]:
    return [JobSpec(name=f"ops-{i:06d}", schedule="@hourly", jitter=JITTER_S) for i in range(count)]


async def _floor_bucket(url: str, data: list[bytes], write: Callable[..., object]) -> float:
    client = await connect(url)
    try:
        js = client.jetstream()
        with contextlib.suppress(Exception):
            await js.delete_key_value(FLOOR_BUCKET)
        await js.create_key_value(
            KeyValueConfig(bucket=FLOOR_BUCKET, history=5, storage=StorageType.FILE)
        )
        began = time.perf_counter()
        await write(client, js, data)  # type: ignore[misc]
        took = time.perf_counter() - began
        status = await js.stream_info(f"KV_{FLOOR_BUCKET}")
        if (status.state.messages or 0) != len(data):
            raise RuntimeError(f"floor bucket holds {status.state.messages} of {len(data)}")
        await js.delete_key_value(FLOOR_BUCKET)
        return took
    finally:
        await client.close()


async def _one_inbox(client: object, js: object, data: list[bytes]) -> None:
    writes = [(f"$KV.{FLOOR_BUCKET}.ops-{i:06d}", d, 0) for i, d in enumerate(data)]
    answers = await conditional_writes(JetStreamPipeline(client), writes)  # type: ignore[arg-type]
    if not all(isinstance(a, int) for a in answers):
        raise RuntimeError("a floor write was refused")


async def _js_publish(client: object, js: object, data: list[bytes]) -> None:
    await gather_limited(
        (
            js.publish(f"$KV.{FLOOR_BUCKET}.ops-{i:06d}", d)  # type: ignore[attr-defined]
            for i, d in enumerate(data)
        ),
        1024,
    )


def _cli(url: str, command: Command, work: Path) -> Command:
    """Run the command with its output in a file (a listing of 100,000 jobs is tens of MB)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HRWCRON_")}
    env["HRWCRON_NATS_URL"] = url
    out_path, err_path = work / "stdout", work / "stderr"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        began = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "hrwcron", *command.argv, "--quiet", "--timeout", "30"],
            env=env,
            stdout=out,
            stderr=err,
            cwd=ROOT,
            check=False,
        )
        command.seconds = time.perf_counter() - began
    command.exit_code = done.returncode
    lines = _tail(out_path).splitlines()
    command.last_line = lines[-1] if lines else _tail(err_path)[-300:]
    return command


def _tail(path: Path, size: int = 4096) -> str:
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - size))
        return fh.read().decode(errors="replace")


def _loaded_jobs(http: str) -> int:
    with urllib.request.urlopen(f"http://{http}/status?limit=1", timeout=10) as response:
        return int(json.loads(response.read())["summary"]["jobs"])


async def _all_loaded(fleet: Fleet, count: int) -> bool:
    for replica in fleet.members:
        try:
            loaded = await asyncio.to_thread(_loaded_jobs, replica.env["HRWCRON_HTTP_LISTEN"])
        except (OSError, ValueError, KeyError):
            return False  # busy loading: ask again
        if loaded != count:
            return False
    return True


async def run(dep: Deployment, jobs: int, log: Callable[[str], None]) -> OperatorResult:
    result = OperatorResult(jobs=jobs, deployment=dep.kind)
    wanted = specs(jobs)
    encoded = [encode(s) for s in wanted]
    ways = (("pipelined rounds of 4096", _one_inbox), ("js.publish, 1024 in flight", _js_publish))
    for name, write in ways:
        result.floors[name] = await _floor_bucket(dep.url, encoded, write)
        log(f"  floor ({name}): {jobs:,} puts in {result.floors[name]:.2f} s")
    fleet = dep.fleet("operator")
    work = Path(tempfile.mkdtemp(prefix="hrwcron-bench-ops-"))
    try:
        fleet.start(3)
        await fleet.wait_ready(timeout=120)
        jobs_file = work / "jobs.json"
        jobs_file.write_bytes(msgspec.json.encode(wanted))

        async def timed(key: str, what: str, *argv: str) -> Command:
            command = await asyncio.to_thread(_cli, dep.url, Command(what, list(argv)), work)
            result.commands[key] = command
            log(
                f"  {what}: {command.seconds:.2f} s (exit {command.exit_code}) "
                f"{command.last_line[:120]!r}"
            )
            if command.exit_code != 0:
                raise RuntimeError(f"{what} exited {command.exit_code}: {command.last_line}")
            return command

        await timed("apply_new", f"apply {jobs:,} new jobs", "apply", str(jobs_file))
        began = time.perf_counter()
        await until(lambda: _all_loaded(fleet, jobs), 600, f"every replica to load {jobs} jobs")
        result.loaded_s = time.perf_counter() - began
        log(f"  every replica runs all {jobs:,} jobs {result.loaded_s:.1f} s later")
        await timed("no_change", "apply, no change", "apply", str(jobs_file))
        changed = [
            msgspec.structs.replace(s, description="changed") if i % CHANGED_SHARE == 0 else s
            for i, s in enumerate(wanted)
        ]
        jobs_file.write_bytes(msgspec.json.encode(changed))
        await timed("change", f"apply, {jobs // CHANGED_SHARE:,} changed", "apply", str(jobs_file))
        await timed("ls", "jobs ls --json", "jobs", "ls", "--json")
        await timed("status", "status (first screen)", "status")
        await timed("status_all", "status --all --json", "status", "--all", "--json")
    finally:
        fleet.stop()
        await asyncio.to_thread(shutil.rmtree, work, True)
    return result


# ---------------------------------------------------------------------------------- report


def section(r: OperatorResult | None, number: int) -> list[str]:
    if r is None:
        return []
    floor = r.floor_s
    out = [
        f"## {number}. Operator commands at {r.jobs:,} jobs",
        "",
        f"3 replicas on a {r.deployment} nats-server; `@hourly` jobs with `jitter = 3600s`. "
        "Each command is a `python -m hrwcron ... --quiet` process timed from spawn to exit "
        "(interpreter start included), as an operator runs it; `apply` reads a JSON array. The "
        f"floor: one process putting the same {r.jobs:,} job specs into a KV bucket configured "
        "like the jobs bucket (history 5, file storage), as fast as it can; the faster of two "
        "ways counts: "
        + ", ".join(f"{name} {fmt(s, 2)} s" for name, s in r.floors.items())
        + ". An apply of new jobs writes two messages per job (the subject claim, then the "
        "job), each compare-and-set, after every job is checked by a replica.",
        "",
        "| command | seconds | jobs/s | × floor | target |",
        "|---|---:|---:|---:|---|",
    ]
    targets = {
        "apply_new": f"< {TARGETS['apply_new']:g} s, ≤ {FLOOR_RATIO:g}× floor",
        "no_change": f"< {TARGETS['no_change']:g} s",
        "ls": f"< {TARGETS['ls']:g} s",
        "status": f"< {TARGETS['status']:g} s",
    }
    out.append(
        f"| floor: {r.jobs:,} pipelined KV puts | {fmt(floor, 2)} | "
        f"{fmt(r.jobs / floor, 0)} | 1.00 | |"
    )
    for key, command in r.commands.items():
        seconds = r.seconds(key)
        shown = " ".join("jobs.json" if a.endswith(".json") else a for a in command.argv)
        out.append(
            f"| {command.what}: `hrwcron {shown}` | {fmt(seconds, 2)} | "
            f"{fmt(r.jobs / seconds, 0)} | {fmt(ratio(seconds, floor), 2)} | "
            f"{targets.get(key, '')} |"
        )
    out += [
        "",
        f"After the first apply returned, every replica ran all {r.jobs:,} jobs "
        f"{fmt(r.loaded_s, 1)} s later (each replica loads every job).",
        "",
    ]
    return out


def goal_rows(r: OperatorResult | None) -> list[tuple[str, str, str]]:
    if r is None or not r.commands:
        return []
    n = f"{r.jobs:,} jobs"
    new = r.seconds("apply_new")
    times = ratio(new, r.floor_s)
    rows = [
        (f"operator ({n}): apply of new jobs < 30 s", f"{fmt(new, 1)} s", _ok(new < 30)),
        (
            f"operator ({n}): apply of new jobs ≤ 3× the job-write floor",
            f"{fmt(times, 1)}×",
            _ok(times <= FLOOR_RATIO),
        ),
    ]
    for key, label in (
        ("no_change", "no-change apply"),
        ("ls", "`jobs ls`"),
        ("status", "`status`, first screen"),
    ):
        seconds = r.seconds(key)
        limit = TARGETS[key]
        measured = f"{fmt(seconds, 2)} s"
        rows.append((f"operator ({n}): {label} < {limit:g} s", measured, _ok(seconds < limit)))
    return rows


def _ok(flag: bool) -> str:
    return "yes" if flag else "**no**"
