"""NATS over TLS with credentials, and secrets kept out of everything a replica shows.

The server gets a certificate from a CA the test makes up (trustme) and requires TLS plus a
user and password. Replicas are real processes at debug log level, so every line they could
write about a connection is written; none may contain a secret.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
import trustme
from nats.aio.client import Client

from harness import NatsServer, ReplicaProcess, wait_for_async
from hrwcron.adapters.http import HttpServer
from hrwcron.core.config import load_config
from hrwcron.core.model import JobSpec, encode

DEADLINE = 30.0
USER = "hrwcron"
PASSWORD = "Pw-7hVq2-secret"
TOKEN = "Tk-9xLm4-secret"
SECRETS = (PASSWORD, TOKEN)
HARNESS_ENV = ("HRWCRON_NATS_SERVER", "HRWCRON_LIBFAKETIME", "HRWCRON_KEEP_NATS_DIRS")
HTTP_AT = re.compile(r"http endpoint at (http://\S+)")


@dataclass
class TlsServer:
    server: NatsServer
    ca_path: Path

    @property
    def url(self) -> str:
        return f"tls://127.0.0.1:{self.server.port}"

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_path))


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[TlsServer]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    certs = tmp_path / "certs"
    certs.mkdir()
    ca_path, chain, key = certs / "ca.pem", certs / "server.pem", certs / "server.key"
    ca.cert_pem.write_to_path(str(ca_path))
    cert.private_key_pem.write_to_path(str(key))
    chain.write_bytes(b"".join(blob.bytes() for blob in cert.cert_chain_pems))
    config = f"""
tls {{
  cert_file: "{chain}"
  key_file: "{key}"
  timeout: 5
}}
authorization {{
  users: [{{user: "{USER}", password: "{PASSWORD}"}}]
}}
"""
    server = NatsServer(config_text=config, name="tls", base_dir=tmp_path / "nats").start()
    try:
        yield TlsServer(server, ca_path)
    finally:
        server.cleanup()


def replica(node: str, log: Path, **env: str) -> ReplicaProcess:
    base = {k: v for k, v in os.environ.items() if k not in HARNESS_ENV}
    base.update(
        {
            "HRWCRON_NODE_ID": node,
            "HRWCRON_HTTP_LISTEN": "127.0.0.1:0",
            "HRWCRON_LOG_LEVEL": "debug",
            "HRWCRON_NATS_CONNECT_TIMEOUT": "3s",
            **env,
        }
    )
    return ReplicaProcess(["run"], base, log, inherit_env=False)


def http_get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows a secret:\n{text[-3000:]}"


async def fired(client: Client, job: str) -> int:
    info = await client.jetstream().stream_info(
        "HRWCRON_TRIGGERS", subjects_filter=f"hrwcron.trigger.{job}"
    )
    return int((info.state.subjects or {}).get(f"hrwcron.trigger.{job}", 0))


async def test_replicas_fire_over_tls_with_credentials_and_never_show_them(
    tls_server: TlsServer, tmp_path: Path
) -> None:
    ca = str(tls_server.ca_path)
    port = tls_server.server.port
    # Credentials in the URL are the ones most often printed by accident (connect errors,
    # reconnect messages); the other replica takes them from their own variables.
    in_url = replica(
        "in-url",
        tmp_path / "in-url.log",
        HRWCRON_NATS_URL=f"tls://{USER}:{PASSWORD}@127.0.0.1:{port}",
        HRWCRON_NATS_TLS_CA=ca,
    )
    in_env = replica(
        "in-env",
        tmp_path / "in-env.log",
        HRWCRON_NATS_URL=tls_server.url,
        HRWCRON_NATS_USER=USER,
        HRWCRON_NATS_PASSWORD=PASSWORD,
        HRWCRON_NATS_TLS_CA=ca,
    )
    procs = (in_url, in_env)
    with in_url, in_env:
        for proc in procs:
            proc.wait_for_log(r"replica \S+ started", DEADLINE)
        nc = await nats.connect(
            tls_server.url, tls=tls_server.context(), user=USER, password=PASSWORD
        )
        try:
            kv = await nc.jetstream().key_value("hrwcron_jobs")
            await kv.put("sealed", encode(JobSpec(name="sealed", schedule="@every 1s")))
            await wait_for_async(
                lambda: _at_least(nc, "sealed", 3), DEADLINE, message="ticks fired over TLS"
            )
            # What a replica publishes about itself for every member to read.
            members = await nc.jetstream().key_value("hrwcron_members")
            for node in ("in-url", "in-env"):
                assert_no_secret(f"heartbeat of {node}", (await members.get(node)).value.decode())
        finally:
            await nc.close()

        for proc in procs:
            base = proc.wait_for_log(HTTP_AT, DEADLINE).group(1)
            pages = ("/", "/jobs", "/jobs/sealed", "/login")
            for path in ("/status", "/status?timeline=1", "/metrics", "/readyz", *pages):
                code, body = http_get(base + path)
                assert code == 200, (path, code, body[:300])
                assert_no_secret(f"{path} of pid {proc.pid}", body)

        # A lost connection and a reconnect: both are logged, neither with the password.
        marks = [proc.mark() for proc in procs]
        tls_server.server.restart()
        for proc, mark in zip(procs, marks, strict=True):
            proc.wait_for_log(r"nats: disconnected", DEADLINE, since=mark)
            proc.wait_for_log(r"nats: reconnected to tls://", DEADLINE, since=mark)
        assert "***@127.0.0.1" in in_url.output()
        for proc in procs:
            assert_no_secret(f"log of pid {proc.pid}", proc.output())


async def _at_least(client: Client, job: str, count: int) -> bool:
    return await fired(client, job) >= count


@pytest.mark.parametrize(
    ("case", "env", "why"),
    [
        (
            "wrong password in the URL",
            {"HRWCRON_NATS_URL": "tls://{user}:{password}-wrong@127.0.0.1:{port}", "ca": "1"},
            r"[Aa]uthorization",
        ),
        (
            "a token the server does not know",
            {"HRWCRON_NATS_URL": "{url}", "HRWCRON_NATS_TOKEN": "{token}", "ca": "1"},
            r"[Aa]uthorization",
        ),
        (
            "plain text to a TLS server",
            {"HRWCRON_NATS_URL": "nats://{user}:{password}@127.0.0.1:{port}"},
            r"CERTIFICATE_VERIFY_FAILED",
        ),
        (
            "a server certificate from an unknown CA",
            {
                "HRWCRON_NATS_URL": "{url}",
                "HRWCRON_NATS_USER": "{user}",
                "HRWCRON_NATS_PASSWORD": "{password}",
            },
            r"CERTIFICATE_VERIFY_FAILED",
        ),
    ],
)
async def test_a_refused_connection_says_why_without_the_secret(
    tls_server: TlsServer, tmp_path: Path, case: str, env: dict[str, str], why: str
) -> None:
    values = {
        "user": USER,
        "password": PASSWORD,
        "token": TOKEN,
        "port": str(tls_server.server.port),
        "url": tls_server.url,
    }
    final = {k: v.format(**values) for k, v in env.items() if k != "ca"}
    if "ca" in env:
        final["HRWCRON_NATS_TLS_CA"] = str(tls_server.ca_path)
    with replica("refused", tmp_path / "refused.log", **final) as proc:
        # A replica keeps retrying its first connection (NATS may come up after it), logging
        # each refusal with its reason.
        proc.wait_for_log(why, DEADLINE)
        proc.kill()
        output = proc.output()
    assert "replica refused started" not in output, case
    assert_no_secret(case, output)


def test_the_http_endpoint_listens_on_loopback_unless_configured_otherwise() -> None:
    listen = load_config(None, {}).http.listen
    host = listen.rpartition(":")[0]
    assert ipaddress.ip_address(host).is_loopback, listen

    async def bound(where: str) -> list[str]:
        server = HttpServer(where, registry=None, source=None)  # type: ignore[arg-type]
        await server.start()
        try:
            return server.addresses
        finally:
            await server.close()

    assert asyncio.run(bound(f"{host}:0")) == [host]
    # Every interface only when asked for by address.
    assert asyncio.run(bound("0.0.0.0:0")) == ["0.0.0.0"]
