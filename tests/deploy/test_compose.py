"""deploy/compose.yaml, checked without a Docker engine: it parses, and what each service runs
agrees with the code and the other files it mounts (configs, scrape targets, NATS configs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from harness import nats_server_binary
from hrwcron.cli import build_parser
from hrwcron.core.config import load_config

from .dockerfile import parse as parse_dockerfile
from .natsconf import passwords_env, random_passwords

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE = DEPLOY / "compose.yaml"
SCHEDULERS = ("scheduler-0", "scheduler-1", "scheduler-2")
NATS_NODES = ("nats-1", "nats-2", "nats-3")

_VARIABLE = re.compile(r"\$(?:\$|\{(\w+)(?:(:?[-?])([^}]*))?\}|(\w+))")


def interpolate(text: str, env: dict[str, str]) -> str:
    """Compose's variable syntax: $VAR, ${VAR}, ${VAR:-default}, ${VAR:?error}, $$."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1) or match.group(4)
        operator, argument = match.group(2), match.group(3)
        value = env.get(name)
        empty = value is None or (operator is not None and operator.startswith(":") and not value)
        if operator and operator.endswith("?") and empty:
            raise AssertionError(f"compose would refuse to start: {name}: {argument}")
        if operator and operator.endswith("-") and empty:
            return argument
        return value or ""

    return _VARIABLE.sub(replace, text)


def required_variables(text: str) -> set[str]:
    return {m.group(1) for m in _VARIABLE.finditer(text) if m.group(2) in (":?", "?")}


@pytest.fixture(scope="module")
def dotenv() -> dict[str, str]:
    """What deploy/.env would hold: every required variable, with made-up values."""
    values = passwords_env(random_passwords())
    values["GRAFANA_ADMIN_PASSWORD"] = "g-test"
    return values


@pytest.fixture(scope="module")
def compose(dotenv: dict[str, str]) -> dict[str, Any]:
    loaded = yaml.safe_load(interpolate(COMPOSE.read_text(), dotenv))
    assert isinstance(loaded, dict)
    return loaded


def service(compose: dict[str, Any], name: str) -> dict[str, Any]:
    found = compose["services"].get(name)
    assert isinstance(found, dict), f"no service {name}"
    return found


def environment(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def mounts(svc: dict[str, Any]) -> dict[PurePosixPath, Path]:
    """Container path -> host path of every bind mount (relative to deploy/)."""
    found: dict[PurePosixPath, Path] = {}
    for volume in svc.get("volumes") or []:
        source, target = str(volume).split(":")[:2]
        if source.startswith("."):
            found[PurePosixPath(target)] = (DEPLOY / source).resolve()
    return found


def host_path(svc: dict[str, Any], container_path: str) -> Path:
    """Where a path inside the container comes from on this machine."""
    wanted = PurePosixPath(container_path)
    for target, source in mounts(svc).items():
        if wanted == target or target in wanted.parents:
            return source / wanted.relative_to(target)
    raise AssertionError(f"{container_path} is not mounted from the repository")


def container_ports(svc: dict[str, Any]) -> set[int]:
    return {int(str(p).rsplit(":", 1)[-1].split("/")[0]) for p in svc.get("ports") or []}


def test_every_secret_is_required_not_defaulted(dotenv: dict[str, str]) -> None:
    text = COMPOSE.read_text()
    assert required_variables(text) == set(dotenv)
    # A missing password stops compose instead of starting NATS with an empty one.
    with pytest.raises(AssertionError, match="NATS_WORKER_PASSWORD"):
        interpolate(text, {k: v for k, v in dotenv.items() if k != "NATS_WORKER_PASSWORD"})


def test_services_and_references_exist(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert {*SCHEDULERS, *NATS_NODES, "worker", "prometheus", "grafana"} <= set(services)
    for name, svc in services.items():
        depends = svc.get("depends_on") or []
        for other in depends:
            assert other in services, f"{name} depends on unknown {other}"
        for target, source in mounts(svc).items():
            assert source.exists(), f"{name} mounts missing {source} at {target}"
    declared = set(compose.get("volumes") or {})
    for name, svc in services.items():
        for volume in svc.get("volumes") or []:
            source = str(volume).split(":")[0]
            if not source.startswith((".", "/")):
                assert source in declared, f"{name} uses undeclared volume {source}"


@pytest.mark.parametrize("name", SCHEDULERS)
def test_scheduler_service_config_passes_check_config(
    compose: dict[str, Any], name: str, tmp_path: Path
) -> None:
    svc = service(compose, name)
    dockerfile = parse_dockerfile()
    assert "entrypoint" not in svc, "the image's ENTRYPOINT is the hrwcron CLI"
    assert svc["build"]["context"] == ".." and svc["build"]["dockerfile"] == "Dockerfile"
    args = build_parser().parse_args(svc["command"])
    assert args.command == "run"
    config_file = host_path(svc, args.config)
    # The container's environment: the image's ENV under the service's own variables.
    image_env = {k: v for k, v in dockerfile.final.env().items() if k.startswith("HRWCRON_")}
    env = {**image_env, **environment(svc)}
    done = subprocess.run(
        [sys.executable, "-m", "hrwcron", "check-config", str(config_file)],
        env={**env, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"node id {name}" in done.stdout
    config = load_config(str(config_file), env)
    assert config.nats.user == "scheduler"
    assert config.nats.password, "the scheduler's password comes from the environment"
    host, _, port = config.http.listen.rpartition(":")
    assert host == "0.0.0.0"
    assert container_ports(svc) == {int(port)}
    # Every NATS URL names a NATS service on the port its config listens on.
    for url in config.nats.servers:
        match = re.fullmatch(r"nats://([\w-]+):(\d+)", url)
        assert match and match.group(1) in NATS_NODES and match.group(2) == "4222", url
    assert config.scheduler.replicas == len(NATS_NODES)


def test_scheduler_node_ids_are_distinct(compose: dict[str, Any]) -> None:
    ids = [environment(service(compose, name))["HRWCRON_NODE_ID"] for name in SCHEDULERS]
    assert len(set(ids)) == len(ids)


def test_prometheus_scrapes_every_scheduler(compose: dict[str, Any]) -> None:
    svc = service(compose, "prometheus")
    config_arg = next(a for a in svc["command"] if a.startswith("--config.file="))
    scrape = yaml.safe_load(host_path(svc, config_arg.split("=", 1)[1]).read_text())
    targets = {
        target
        for job in scrape["scrape_configs"]
        for static in job.get("static_configs") or []
        for target in static.get("targets") or []
    }
    for name in SCHEDULERS:
        port = load_config(
            str(host_path(service(compose, name), "/etc/hrwcron/hrwcron.toml")),
            {**environment(service(compose, name))},
        ).http.listen.rpartition(":")[2]
        assert f"{name}:{port}" in targets
    for rule_file in scrape.get("rule_files") or []:
        assert host_path(svc, f"/etc/prometheus/{rule_file}").is_file(), rule_file


def test_grafana_gets_the_dashboard(compose: dict[str, Any]) -> None:
    svc = service(compose, "grafana")
    provider = yaml.safe_load(compose["configs"]["grafana-dashboards"]["content"])
    path = provider["providers"][0]["options"]["path"]
    dashboards = [t for t in mounts(svc) if t.parent == PurePosixPath(path)]
    assert dashboards, f"no dashboard mounted under {path}"
    assert mounts(svc)[dashboards[0]] == DEPLOY / "grafana" / "hrwcron-dashboard.json"
    datasource = yaml.safe_load(compose["configs"]["grafana-datasource"]["content"])
    url = datasource["datasources"][0]["url"]
    assert url == f"http://prometheus:{container_ports(service(compose, 'prometheus')).pop()}"


def test_worker_runs_the_example_as_the_worker_user(compose: dict[str, Any]) -> None:
    svc = service(compose, "worker")
    program, script = svc["entrypoint"][:2]
    assert program == "python"
    assert host_path(svc, script) == ROOT / "examples" / "worker.py"
    env = environment(svc)
    # Any HRWCRON_* variable must be one the configuration loader knows.
    config = load_config(None, env)
    (url,) = config.nats.servers
    match = re.fullmatch(r"nats://worker:([^@]+)@([\w-]+):4222", url)
    assert match, url
    assert match.group(2) in NATS_NODES


@pytest.mark.parametrize("name", NATS_NODES)
def test_nats_service_config_passes_nats_server_check(
    compose: dict[str, Any], name: str, dotenv: dict[str, str]
) -> None:
    svc = service(compose, name)
    assert svc["entrypoint"] == ["nats-server"]
    flag, path = svc["command"]
    assert flag == "--config"
    config_file = host_path(svc, path)
    assert config_file == ROOT / "nats" / "cluster" / f"node-{name[-1]}.conf"
    env = environment(svc)
    assert env == {k: v for k, v in dotenv.items() if k.startswith("NATS_")}
    done = subprocess.run(
        [nats_server_binary(), "-t", "-c", str(config_file)],
        env={**env, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    text = config_file.read_text()
    # The data volume holds the JetStream store; the health check asks the monitor port.
    store = re.search(r'store_dir: "([^"]+)"', text)
    assert store is not None
    data = [str(v).split(":")[1] for v in svc["volumes"] if not str(v).startswith(".")]
    assert any(PurePosixPath(store.group(1)).is_relative_to(d) for d in data)
    assert f"server_name: {name}" in text
    monitor = re.search(r"(?m)^http: [\d.]+:(\d+)$", text)
    assert monitor is not None
    assert f":{monitor.group(1)}/healthz" in " ".join(svc["healthcheck"]["test"])
