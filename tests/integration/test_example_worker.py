"""``examples/worker.py`` against secured servers, connecting the way the CLI does: a config
file (``--config`` or ``HRWCRON_CONFIG``) and ``HRWCRON_NATS_*`` variables, with user and
password, token or NKEY seed, over TLS with a client certificate where the server asks for one.

Each case starts a nats-server that accepts only its own way in, a replica (in-process, with
the same credentials) that fires a job every second, and the example as a real process; the
example must print that job's triggers and never a secret.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nkeys
import pytest
import trustme

from harness import NatsServer, ReplicaProcess
from hrwcron.core.config import Config, HttpConfig, NatsConfig, SchedulerConfig
from hrwcron.core.model import JobSpec
from hrwcron.engine.ports import NullObserver
from hrwcron.process.app import start_replica

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "worker.py"
DEADLINE = 30.0
HARNESS_ENV = ("HRWCRON_NATS_SERVER", "HRWCRON_LIBFAKETIME", "HRWCRON_KEEP_NATS_DIRS")
PASSWORD = f"Pw-{secrets.token_hex(8)}"
TOKEN = f"Tk-{secrets.token_hex(8)}"
JOB = JobSpec(name="example.every-second", schedule="@every 1s")


@dataclass
class Pki:
    ca: Path
    client_cert: Path
    client_key: Path
    server_block: Callable[[bool], str]


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("example-worker@hrwcron.test")
    certs = tmp_path / "certs"
    certs.mkdir()
    paths = {name: certs / name for name in ("ca.pem", "server.pem", "server.key")}
    ca.cert_pem.write_to_path(str(paths["ca.pem"]))
    server.private_key_pem.write_to_path(str(paths["server.key"]))
    paths["server.pem"].write_bytes(b"".join(b.bytes() for b in server.cert_chain_pems))
    client_cert, client_key = certs / "client.pem", certs / "client.key"
    client_cert.write_bytes(b"".join(b.bytes() for b in client.cert_chain_pems))
    client.private_key_pem.write_to_path(str(client_key))

    def server_block(verify: bool) -> str:
        return f"""
tls {{
  cert_file: "{paths["server.pem"]}"
  key_file: "{paths["server.key"]}"
  ca_file: "{paths["ca.pem"]}"
  verify: {"true" if verify else "false"}
  timeout: 5
}}
"""

    return Pki(paths["ca.pem"], client_cert, client_key, server_block)


@dataclass
class Case:
    """A server that admits one way in, and that way as a config file plus variables."""

    server_config: str
    nats: NatsConfig  # what the in-process replica uses
    toml: str  # the [nats] section the worker reads
    env: dict[str, str]  # HRWCRON_* variables the worker gets
    flag_config: bool  # --config FILE, or HRWCRON_CONFIG=FILE


def user_and_password_with_client_certificate(pki: Pki, tmp_path: Path) -> Case:
    return Case(
        server_config=pki.server_block(True)
        + f'authorization {{ users: [{{user: "worker", password: "{PASSWORD}"}}] }}\n',
        nats=NatsConfig(
            user="worker",
            password=PASSWORD,
            tls_ca=str(pki.ca),
            tls_cert=str(pki.client_cert),
            tls_key=str(pki.client_key),
        ),
        # Relative paths: the loader resolves them against the file's directory.
        toml=(
            f'user = "worker"\npassword = "{PASSWORD}"\ntls_ca = "certs/{pki.ca.name}"\n'
            f'tls_cert = "certs/{pki.client_cert.name}"\ntls_key = "certs/{pki.client_key.name}"\n'
        ),
        env={},
        flag_config=True,
    )


def nkey_seed_from_the_environment(pki: Pki, tmp_path: Path) -> Case:
    seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
    public = nkeys.from_seed(bytearray(seed)).public_key.decode()
    seed_file = tmp_path / "worker.nk"
    seed_file.write_bytes(seed + b"\n")
    seed_file.chmod(0o600)
    return Case(
        server_config=pki.server_block(False)
        + f'authorization {{ users: [{{nkey: "{public}"}}] }}\n',
        nats=NatsConfig(nkey_seed=str(seed_file), tls_ca=str(pki.ca)),
        toml=f'tls_ca = "certs/{pki.ca.name}"\n',
        env={"HRWCRON_NATS_NKEY_SEED": str(seed_file)},
        flag_config=False,
    )


def token_from_the_environment(pki: Pki, tmp_path: Path) -> Case:
    return Case(
        server_config=pki.server_block(False) + f'authorization {{ token: "{TOKEN}" }}\n',
        nats=NatsConfig(token=TOKEN, tls_ca=str(pki.ca)),
        toml="",
        env={"HRWCRON_NATS_TOKEN": TOKEN, "HRWCRON_NATS_TLS_CA": str(pki.ca)},
        flag_config=True,
    )


CASES = {
    "user and password, client certificate, --config": user_and_password_with_client_certificate,
    "NKEY seed in HRWCRON_NATS_NKEY_SEED, HRWCRON_CONFIG": nkey_seed_from_the_environment,
    "token in HRWCRON_NATS_TOKEN, --config": token_from_the_environment,
}


@pytest.fixture
def worker_env() -> Iterator[dict[str, str]]:
    # The worker, like every hrwcron command, refuses HRWCRON_* variables it does not know.
    yield {k: v for k, v in os.environ.items() if k not in HARNESS_ENV}


@pytest.mark.parametrize("case_name", CASES)
async def test_example_worker_connects_like_the_cli(
    case_name: str, pki: Pki, tmp_path: Path, worker_env: dict[str, str]
) -> None:
    case = CASES[case_name](pki, tmp_path)
    server = NatsServer(config_text=case.server_config, name="secured", base_dir=tmp_path / "nats")
    with server:
        url = f"tls://127.0.0.1:{server.port}"
        config_file = tmp_path / "hrwcron.toml"
        config_file.write_text(f'[nats]\nservers = ["{url}"]\n{case.toml}')
        replica = await start_replica(
            Config(
                nats=msgspec.structs.replace(case.nats, servers=[url]),
                scheduler=SchedulerConfig(node_id="fires"),
                http=HttpConfig(listen=""),
                jobs=[JOB],
            ),
            {},
            NullObserver(),
        )
        try:
            env = {**worker_env, **case.env}
            args = [str(EXAMPLE)]
            if case.flag_config:
                args += ["--config", str(config_file)]
            else:
                env["HRWCRON_CONFIG"] = str(config_file)
            worker = ReplicaProcess(
                args, env, tmp_path / "worker.log", module=None, inherit_env=False
            )
            with worker:
                # In a thread: the replica runs on this event loop and must keep firing.
                pattern = rf"^{re.escape(JOB.name)}\s+{re.escape(JOB.name)}:\d+ "
                await asyncio.to_thread(worker.wait_for_log, pattern, DEADLINE)
                status = await asyncio.to_thread(worker.terminate, DEADLINE)
            output = worker.output()
            assert status.returncode == 0, output
            assert "handled " in output
            for secret in (PASSWORD, TOKEN):
                assert secret not in output
        finally:
            await replica.stop()


def test_bad_connection_settings_are_refused_before_connecting(
    tmp_path: Path, worker_env: dict[str, str]
) -> None:
    config_file = tmp_path / "hrwcron.toml"
    config_file.write_text('[nats]\nuser = "worker"\ntls_ca = "missing.pem"\n')
    worker = ReplicaProcess(
        [str(EXAMPLE), "--config", str(config_file)],
        {**worker_env, "HRWCRON_NATS_TOKEN": TOKEN},
        tmp_path / "worker.log",
        module=None,
        inherit_env=False,
    )
    assert worker.wait(DEADLINE) == 1
    output = worker.output()
    assert "nats.user: needs nats.password" in output
    assert f"nats.tls_ca: file not found: {tmp_path / 'missing.pem'}" in output
    assert "nats.token: conflicts with nats.user" in output
    assert TOKEN not in output
