"""Round trips over the corpus in tests/vectors/imports: every imported job's ``hrwcron next``
instants (the job's TickPlan, as the command computes them) against the source read on its
own terms by tests/harness/cron_oracle.py, which shares no code with the importers or hrwcron's
schedules.

Where cronie or the CronJob controller and hrwcron differ on daylight saving, the tests say
so and assert the documented mapping rather than hide it: entries in the host's zone follow
Vixie's time-change rules, which are hrwcron's; an entry after ``CRON_TZ=``, and every
CronJob, is matched by cronie (robfig/cron) against wall time minute by minute, so a
fixed-time one never runs for a skipped time and runs twice in a repeated hour. The imported
job runs once in both cases, at the end of the gap and on the first pass.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from harness.cron_oracle import (
    Reading,
    cronie_reading,
    robfig_reading,
    transitions,
    vixie_instants,
    wall_clock_instants,
)
from hrwcron.core.model import JobSpec
from hrwcron.importers import (
    CrontabOptions,
    KubernetesOptions,
    read_crontab,
    read_manifests,
)

CORPUS = Path(__file__).resolve().parents[1] / "vectors" / "imports"
COUNT = 40
DAY_MS = 86_400_000


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp() * 1000)


def next_instants(spec: JobSpec, start: int, count: int = COUNT) -> list[int]:
    plan = spec.plan()
    out: list[int] = []
    at = start
    while len(out) < count:
        due = plan.next_after(at)
        assert due is not None
        out.append(due)
        at = due
    return out


def starts(zone: str) -> list[int]:
    """A quiet start, and a few hours before each of the zone's transitions in 2026 and 2027."""
    found = [ms("2026-01-10T00:00:00+00:00")]
    for year in (2026, 2027):
        found += [t - 3 * 3_600_000 for t in transitions(zone, year)]
    return found


def near_transition(instant: int, zone: str) -> bool:
    year = datetime.fromtimestamp(instant / 1000, UTC).year
    points = [t for y in (year - 1, year, year + 1) for t in transitions(zone, y)]
    return any(abs(instant - t) <= DAY_MS for t in points)


def check_round_trip(spec: JobSpec, reading: Reading, what: str, *, wall_clock: bool) -> None:
    """hrwcron's instants are the source's under hrwcron's DST policy, from every start; and
    the source's own DST behaviour (``wall_clock``: cronie with CRON_TZ, robfig/cron) differs
    from them only for fixed-time entries, only next to a transition."""
    for start in starts(spec.tz):
        got = next_instants(spec, start)
        assert got == vixie_instants(reading, spec.tz, start, got[-1]), f"{what} from {start}"
        if not wall_clock:
            continue
        theirs = wall_clock_instants(reading, spec.tz, start, got[-1])
        differ = set(theirs) ^ set(got)
        if not reading.fixed:
            assert not differ, what
        assert all(near_transition(t, spec.tz) for t in differ), (what, sorted(differ))


# --- crontab -----------------------------------------------------------------------------------

_VARIABLE = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(.*)")


@dataclass
class Entry:
    line: int
    schedule: str
    user: str | None
    command: str
    env: dict[str, str]
    mail_only_on_error: bool


def crontab_entries(text: str, *, system: bool) -> list[Entry]:
    """The corpus's entries, read the plain way its lines are written: variables as NAME=value
    (quotes stripped), five fields or a macro, the user, cronie's -n option, the rest."""
    env: dict[str, str] = {}
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        variable = _VARIABLE.fullmatch(line)
        if variable:
            env[variable.group(1)] = variable.group(2).strip("\"'")
            continue
        words = line.split(None, 1 if line.startswith("@") else 5)
        schedule = " ".join(words[:-1])
        rest = words[-1]
        user = None
        if system:
            user, rest = rest.split(None, 1)
        option = rest.startswith("-n ")
        entries.append(
            Entry(number, schedule, user, rest[3:] if option else rest, dict(env), option)
        )
    return entries


CRONTABS = [
    # (file, system, host zone)
    ("user.crontab", False, "Europe/London"),
    ("system.crontab", True, "America/Chicago"),
]


@pytest.mark.parametrize(("name", "system", "host"), CRONTABS)
def test_each_crontab_entry_imports_to_the_instants_cronie_runs_it_at(
    name: str, system: bool, host: str
) -> None:
    text = (CORPUS / name).read_text()
    report = read_crontab(text.encode(), name, CrontabOptions(system=system, tz=host))
    assert report.problems == []
    entries = crontab_entries(text, system=system)
    assert len(report.specs) == len(entries) >= 10
    assert len({spec.name for spec in report.specs}) == len(entries)
    for spec, entry in zip(report.specs, entries, strict=True):
        what = f"{name}:{entry.line} {entry.schedule}"
        assert spec.tz == (entry.env.get("CRON_TZ") or host), what
        assert spec.payload.get("env") == (entry.env or None), what
        assert spec.payload.get("user") == entry.user, what
        assert spec.payload.get("mail_only_on_error", False) is entry.mail_only_on_error, what
        if "%" not in entry.command:
            assert spec.payload["command"] == entry.command, what
        check_round_trip(
            spec,
            cronie_reading(entry.schedule),
            what,
            wall_clock=bool(entry.env.get("CRON_TZ")),
        )


def test_the_corpus_entries_are_of_real_world_variety() -> None:
    """The tables cover what makes crontabs differ (macros, names, steps, lists, the OR rule,
    a step wider than its field, Sunday as 7, % standard input, CRON_TZ zones with DST) and a
    dozen CronJobs."""
    text = (CORPUS / "user.crontab").read_text()
    schedules = [e.schedule for e in crontab_entries(text, system=False)]
    readings = [cronie_reading(s) for s in schedules]
    assert any(s.startswith("@") for s in schedules)
    assert any(r.day_or for r in readings)
    assert any("*/30" in s.split()[1] for s in schedules if not s.startswith("@"))
    assert any(s.split()[-1] == "7" for s in schedules if not s.startswith("@"))
    assert "%" in text and "CRON_TZ=Europe/Berlin" in text
    manifests = [cronjobs((CORPUS / name).read_text()) for name, _ in MANIFESTS]
    assert sum(len(objects) for objects in manifests) >= 10


def _import_user_crontab() -> dict[str, JobSpec]:
    data = (CORPUS / "user.crontab").read_bytes()
    report = read_crontab(data, "user.crontab", CrontabOptions(tz="Europe/London"))
    return {spec.payload["command"]: spec for spec in report.specs}


def test_cron_tz_entries_differ_from_cronie_at_dst_exactly_as_documented() -> None:
    """cronie runs a CRON_TZ entry whenever the zone's wall time matches: not at all on the
    night 02:30 does not exist in Berlin, twice on the night 01:30 comes twice in New York.
    The imported jobs run once on each of those nights: as the gap ends (03:00 CEST) and on the
    first pass (01:30 EDT)."""
    jobs = _import_user_crontab()
    berlin = jobs["/usr/local/bin/berlin-0230"]
    ny = jobs["/usr/local/bin/ny-0130"]
    window = (ms("2026-03-28T12:00:00+00:00"), ms("2026-03-30T12:00:00+00:00"))
    reading = cronie_reading("30 2 * * *")
    cronie = wall_clock_instants(reading, "Europe/Berlin", *window)
    ours = [t for t in next_instants(berlin, window[0], 3) if t <= window[1]]
    assert cronie == [ms("2026-03-30T00:30:00+00:00")]
    assert ours == [ms("2026-03-29T01:00:00+00:00"), ms("2026-03-30T00:30:00+00:00")]

    window = (ms("2026-10-31T12:00:00+00:00"), ms("2026-11-02T12:00:00+00:00"))
    reading = cronie_reading("30 1 * * *")
    cronie = wall_clock_instants(reading, "America/New_York", *window)
    ours = [t for t in next_instants(ny, window[0], 3) if t <= window[1]]
    passes = [ms("2026-11-01T05:30:00+00:00"), ms("2026-11-01T06:30:00+00:00")]
    assert cronie == [*passes, ms("2026-11-02T06:30:00+00:00")]
    assert ours == [passes[0], ms("2026-11-02T06:30:00+00:00")]


def test_host_zone_entries_agree_with_cronie_through_dst() -> None:
    """In the host's zone cronie's own time-change handling is the same policy: 01:20 on the
    night London skips 01:00-02:00 runs as the clock jumps, at 02:00 BST."""
    spec = _import_user_crontab()["/usr/local/bin/fetch-feeds"]
    assert spec.jitter == 600.0  # RANDOM_DELAY=10 minutes
    got = next_instants(spec, ms("2026-03-28T12:00:00+00:00"), 2)
    assert got == [ms("2026-03-29T01:00:00+00:00"), ms("2026-03-30T00:20:00+00:00")]


# --- Kubernetes --------------------------------------------------------------------------------

MANIFESTS = [
    # (file, the objects skipped with a note)
    ("cronjobs.yaml", ["Service web"]),
    ("list.yaml", []),
    ("helm-rendered.yaml", ["ConfigMap release-nightly-jobs"]),
]
_OVERLAP = {None: "allow", "Allow": "allow", "Forbid": "skip"}


def cronjobs(text: str) -> list[dict[str, Any]]:
    found = []
    for doc in yaml.safe_load_all(text):
        for obj in doc.get("items", [doc]) if doc.get("kind") == "List" else [doc]:
            if obj.get("kind") == "CronJob":
                found.append(obj)
    return found


@pytest.mark.parametrize(("name", "skipped"), MANIFESTS)
def test_each_cronjob_imports_to_the_instants_the_controller_starts_it_at(
    name: str, skipped: list[str]
) -> None:
    data = (CORPUS / name).read_bytes()
    report = read_manifests([(name, data)], KubernetesOptions(tz="UTC"))
    assert report.problems == []
    objects = cronjobs(data.decode())
    assert len(report.specs) == len(objects) >= 2
    skips = [n.message for n in report.notes if n.message.startswith("skipped")]
    assert skips == [f"skipped {s} (not a CronJob)" for s in skipped]
    for spec, obj in zip(report.specs, objects, strict=True):
        meta, cj = obj["metadata"], obj["spec"]
        what = f"{meta['name']} {cj['schedule']}"
        assert spec.name == f"{meta.get('namespace', 'default')}.{meta['name']}"
        assert spec.tz == cj.get("timeZone", "UTC"), what
        assert spec.paused is bool(cj.get("suspend")), what
        assert spec.overlap == _OVERLAP[cj.get("concurrencyPolicy")], what
        assert spec.max_lateness == cj.get("startingDeadlineSeconds", 60), what
        assert spec.catchup == "latest"
        template = msgspec.json.decode(msgspec.json.encode(cj["jobTemplate"]))
        assert spec.payload == {
            "namespace": meta.get("namespace", "default"),
            "cronjob": meta["name"],
            "jobTemplate": template,
        }
        check_round_trip(spec, robfig_reading(cj["schedule"]), what, wall_clock=True)


def test_cronjobs_differ_from_the_controller_at_dst_exactly_as_documented() -> None:
    """robfig/cron matches wall time, so 15 1 * * * in London never starts on the night
    01:00-02:00 is skipped and starts twice on the night it repeats; the imported job starts
    once on each: at 02:00 BST, and at 01:15 BST (the first pass)."""
    files = [("list.yaml", (CORPUS / "list.yaml").read_bytes())]
    [spec] = [s for s in read_manifests(files).specs if s.name == "uk.london-early"]
    reading = robfig_reading("15 1 * * *")
    for day, controller, ours in [
        ("2026-03-29", [], ["2026-03-29T01:00:00+00:00"]),
        (
            "2026-10-25",
            ["2026-10-25T00:15:00+00:00", "2026-10-25T01:15:00+00:00"],
            ["2026-10-25T00:15:00+00:00"],
        ),
    ]:
        lo = ms(f"{day}T00:00:00+01:00") - 3_600_000
        hi = lo + DAY_MS - 1
        assert wall_clock_instants(reading, "Europe/London", lo, hi) == [ms(t) for t in controller]
        assert [t for t in next_instants(spec, lo, 3) if t <= hi] == [ms(t) for t in ours]


def test_robfig_reads_a_star_step_day_field_as_restricted_and_the_import_keeps_that() -> None:
    """0 6 */2 * 1 runs on odd days OR Mondays under the controller; cronie (and hrwcron, for
    the same text) would read */2 as unrestricted and run on odd Mondays only."""
    files = [("cronjobs.yaml", (CORPUS / "cronjobs.yaml").read_bytes())]
    [spec] = [s for s in read_manifests(files).specs if s.name == "ops.odd-days-or-monday"]
    start = ms("2026-02-01T00:00:00+00:00")
    got = next_instants(spec, start, 10)
    days = [datetime.fromtimestamp(t / 1000, UTC) for t in got]
    assert any(d.day % 2 == 0 and d.isoweekday() == 1 for d in days)  # an even Monday
    assert any(d.day % 2 == 1 and d.isoweekday() != 1 for d in days)  # an odd other day
    assert got == vixie_instants(robfig_reading("0 6 */2 * 1"), "UTC", start, got[-1])
    assert got != vixie_instants(cronie_reading("0 6 */2 * 1"), "UTC", start, got[-1])
