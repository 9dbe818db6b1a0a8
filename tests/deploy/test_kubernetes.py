"""deploy/kubernetes, checked offline: every manifest against the newest Kubernetes schema that
kubernetes-validate bundles (strict: unknown fields fail), and the pieces agree with each other
and with what the code reads."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml
from kubernetes_validate import utils as kv

from hrwcron.cli import build_parser
from hrwcron.core.config import SchedulerConfig, load_config

from .dockerfile import parse as parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
MANIFESTS = sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")
# Oldest Kubernetes release still supported upstream when these manifests were written; the
# bundled schemas must be at least this new for "current" to mean anything.
OLDEST_CURRENT = (1, 31)
POD_NAME = "hrwcron-7c9f8d6b5d-x2x9k"


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def resources() -> dict[tuple[str, str], dict[str, Any]]:
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for path in MANIFESTS:
        for doc in documents(path):
            found[(doc["kind"], doc["metadata"]["name"])] = doc
    return found


def one(kind: str) -> dict[str, Any]:
    (match,) = [doc for (k, _), doc in resources().items() if k == kind]
    return match


def container() -> dict[str, Any]:
    (main,) = one("Deployment")["spec"]["template"]["spec"]["containers"]
    return dict(main)


def test_schemas_are_bundled_and_current() -> None:
    version = kv.latest_version()
    assert tuple(int(x) for x in version.split(".")[:2]) >= OLDEST_CURRENT, version


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_manifest_validates(path: Path) -> None:
    docs = documents(path)
    assert docs
    for doc in docs:
        # SchemaNotFoundError (an unknown kind or apiVersion) fails too, unlike the CLI's warning.
        kv.validate(doc, kv.latest_version(), strict=True)


def test_validation_rejects_a_misspelt_field() -> None:
    deployment = one("Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["securityContext"][
        "readOnlyRootFileSystem"
    ] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, kv.latest_version(), strict=True)


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Kustomization"
    assert sorted(kustomization["resources"]) == [p.name for p in MANIFESTS]
    assert [i["name"] for i in kustomization["images"]] == [container()["image"].split(":")[0]]


def test_deployment_shape() -> None:
    deployment = one("Deployment")
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    main = container()
    assert spec["replicas"] == 3
    labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    env = {e["name"]: e for e in main["env"]}
    assert env["HRWCRON_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "secretKeyRef" in env["HRWCRON_NATS_PASSWORD"]["valueFrom"]
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert main[probe]["httpGet"]["port"] in ports
    # Liveness waits for a start that rides out an election for its whole bound, and more.
    startup = main["startupProbe"]
    assert startup["httpGet"]["path"] == "/healthz"
    budget = startup["periodSeconds"] * startup["failureThreshold"]
    assert budget >= 2 * SchedulerConfig().startup_timeout, budget
    assert main["resources"]["requests"] and main["resources"]["limits"]["memory"]
    security = main["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    image_user = parse_dockerfile().final.one("USER").args.split(":")[0]
    assert str(pod["securityContext"]["runAsUser"]) == image_user
    spread = pod["topologySpreadConstraints"]
    assert {c["topologyKey"] for c in spread} >= {"kubernetes.io/hostname"}
    for constraint in spread:
        assert constraint["labelSelector"]["matchLabels"].items() <= labels.items()
    # A read-only root still needs a writable /tmp.
    mounts = {m["mountPath"]: m["name"] for m in main["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_pdb_and_service_select_the_pods() -> None:
    labels = one("Deployment")["spec"]["template"]["metadata"]["labels"]
    pdb = one("PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"].get("maxUnavailable") == 1 or pdb["spec"].get("minAvailable") == 2
    service = one("Service")
    assert service["spec"]["selector"].items() <= labels.items()
    port_names = {p["name"] for p in container()["ports"]}
    for port in service["spec"]["ports"]:
        assert port["targetPort"] in port_names


def _pod_environment(main: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet would build it for one pod."""
    image_env = parse_dockerfile().final.env()
    env = {k: v for k, v in image_env.items() if k.startswith("HRWCRON_")}
    for entry in main["env"]:
        source = entry.get("valueFrom", {})
        if "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.name"
            env[entry["name"]] = POD_NAME
        elif "secretKeyRef" in source:
            env[entry["name"]] = "p-from-the-secret"
        else:
            env[entry["name"]] = entry["value"]
    return env


def test_mounted_config_passes_check_config(tmp_path: Path) -> None:
    main = container()
    pod = one("Deployment")["spec"]["template"]["spec"]
    args = build_parser().parse_args(main["args"])
    assert args.command == "run"
    # Follow --config through the volume mount to the ConfigMap key it comes from.
    config_path = PurePosixPath(args.config)
    mount = next(
        m for m in main["volumeMounts"] if PurePosixPath(m["mountPath"]) in config_path.parents
    )
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    configmap = resources()[("ConfigMap", volume["configMap"]["name"])]
    key = str(config_path.relative_to(mount["mountPath"]))
    local = tmp_path / key
    local.write_text(configmap["data"][key])
    env = _pod_environment(main)
    done = subprocess.run(
        [sys.executable, "-m", "hrwcron", "check-config", str(local)],
        env={**env, "PATH": os.environ["PATH"]},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert f"node id {POD_NAME}" in done.stdout
    config = load_config(str(local), env)
    assert config.jobs, "the ConfigMap carries the jobs too"
    assert config.nats.user == "scheduler"
    host, _, port = config.http.listen.rpartition(":")
    assert host == "0.0.0.0"
    assert {p["containerPort"] for p in main["ports"]} == {int(port)}
