"""The shipped Grafana dashboard and Prometheus files: they parse, every metric and label they
use is one hrwcron exports, and (with promtool installed) the queries compile and the alerts
fire on the series they are meant for and stay quiet on a healthy cluster (alerts_test.yml)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from hrwcron.adapters.telemetry import Telemetry

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "hrwcron-dashboard.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = ROOT / "deploy" / "prometheus" / "alerts_test.yml"
# Labels Prometheus adds at scrape (job, instance, replica from the relabelling) or that
# histograms carry (le), besides hrwcron's own.
SCRAPE_LABELS = {"job", "instance", "replica", "le"}
_METRIC = re.compile(r"\bhrwcron_[a-z_]+\b")
_GROUPING = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"")
PROMTOOL = shutil.which("promtool")


class Client:
    def __init__(self) -> None:
        self.is_connected = True
        self.stats = {"reconnects": 0}


def exported() -> tuple[set[str], set[str]]:
    """Sample names and label names a replica exports, with per-job labels on."""
    t = Telemetry(node="n", process_metrics=False)
    t.track_nats(Client())
    for outcome in ("started", "missed"):
        t.outcome("j", outcome, due_ms=1, rank=0, attempt=1, lateness_ms=1.0)
    t.owner_changed("j", "a", "b")
    names: set[str] = set()
    labels: set[str] = set()
    for family in t.registry.collect():
        for s in family.samples:
            names.add(s.name)
            labels.update(s.labels)
    return names, labels


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in board["panels"] for t in p.get("targets", [])]


def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


def test_dashboard_is_well_formed() -> None:
    board = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert board["uid"] == "hrwcron"
    for p in board["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"])
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24, p["title"]
        if p["type"] != "row":
            assert p["targets"], p["title"]
            assert p["datasource"]["uid"] == "${datasource}"
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "instance"} <= variables


@pytest.mark.parametrize("source", ["dashboard", "alerts"])
def test_every_metric_and_label_used_is_exported(source: str) -> None:
    names, labels = exported()
    exprs = dashboard_exprs() if source == "dashboard" else [r["expr"] for r in alert_rules()]
    assert exprs
    for expr in exprs:
        for metric in _METRIC.findall(expr):
            assert metric in names, f"{metric} in {expr!r} is not exported"
        used = {m for group in _GROUPING.findall(expr) for m in re.split(r"\s*,\s*", group) if m}
        used |= set(_MATCHER.findall(expr))
        unknown = used - labels - SCRAPE_LABELS
        assert not unknown, f"{sorted(unknown)} in {expr!r}: no such label"


def test_alert_rules_are_complete() -> None:
    rules = alert_rules()
    names = {r["alert"] for r in rules}
    for needed in (
        "HrwcronMissedTicks",
        "HrwcronNoLiveMembers",
        "HrwcronClockSkew",
        "HrwcronJobDigestMismatch",
        "HrwcronReplicaNotReady",
    ):
        assert needed in names
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning")
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_prometheus_scrapes_three_replicas_and_loads_the_rules() -> None:
    config = yaml.safe_load(PROMETHEUS.read_text())
    assert config["rule_files"] == ["alerts.yml"]
    (job,) = config["scrape_configs"]
    assert job["job_name"] == "hrwcron"  # the alert HrwcronReplicaDown selects on it
    targets = [t for static in job["static_configs"] for t in static["targets"]]
    assert len(targets) == 3
    assert all(t.endswith(":9464") for t in targets)  # http.listen's default port


def promtool(*args: str, cwd: Path) -> None:
    assert PROMTOOL is not None
    done = subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make system-deps)")
def test_promtool_accepts_the_files_and_every_dashboard_query(tmp_path: Path) -> None:
    promtool("check", "config", str(PROMETHEUS), cwd=PROMETHEUS.parent)
    promtool("check", "rules", str(ALERTS), cwd=tmp_path)
    # Dashboard queries compiled as recording rules: a syntax error fails the check.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$instance", ".*")}
        for i, expr in enumerate(dashboard_exprs())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool("check", "rules", str(path), cwd=tmp_path)


def alert_tests() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERT_TESTS.read_text())
    assert doc["rule_files"] == [ALERTS.name]
    return list(doc["tests"])


def test_every_alert_has_a_unit_test_that_fires_it_and_one_that_keeps_it_quiet() -> None:
    """The promtool test file covers every rule both ways, so an alert added without a test, or
    tested only for firing, is caught even where promtool is not installed."""
    fires: dict[str, int] = {}
    quiet_when_healthy: set[str] = set()
    tests = alert_tests()
    healthy = tests[0]
    assert "healthy" in healthy["name"]
    for case in tests:
        for check in case["alert_rule_test"]:
            name = check["alertname"]
            if check.get("exp_alerts"):
                # Exactly one alert: a rule that fires once per replica where one is broken
                # would page several times for one fault.
                assert len(check["exp_alerts"]) == 1, (case["name"], name)
                assert check["exp_alerts"][0]["exp_annotations"], (case["name"], name)
                fires[name] = fires.get(name, 0) + 1
            elif case is healthy:
                quiet_when_healthy.add(name)
    rules = {r["alert"] for r in alert_rules()}
    assert set(fires) == rules, f"alerts no test fires: {sorted(rules - set(fires))}"
    assert quiet_when_healthy == rules, f"not checked quiet: {sorted(rules - quiet_when_healthy)}"


@pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (make system-deps)")
def test_alerts_fire_on_the_series_they_watch_and_stay_quiet_otherwise() -> None:
    promtool("test", "rules", ALERT_TESTS.name, cwd=ALERT_TESTS.parent)
