"""hrwcron run as users run it, as child processes of this Python: the command line
(``hrwcron``) and a replica process (``replica``), each with an environment free of the
variables only the harness reads, pointed at one server."""

from __future__ import annotations

import asyncio
import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

from .procs import ReplicaProcess

# Variables the test harness reads for itself; a replica must not see them, because the
# service rejects unknown HRWCRON_* variables (a typo there should stop a replica, not be ignored).
HARNESS_ENV = ("HRWCRON_NATS_SERVER", "HRWCRON_LIBFAKETIME", "HRWCRON_KEEP_NATS_DIRS")
# The line a replica logs once its HTTP endpoint listens.
HTTP_AT = re.compile(r"http endpoint at (http://\S+)")
COMMAND_TIMEOUT_S = 60.0


class Result(NamedTuple):
    code: int
    out: str
    err: str


async def hrwcron(url: str, *args: str, stdin: bytes | None = None) -> Result:
    """``hrwcron ARGS`` against the server at ``url``, with none of the caller's HRWCRON_*."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HRWCRON_")}
    env["HRWCRON_NATS_URL"] = url
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hrwcron",
        *args,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(stdin), timeout=COMMAND_TIMEOUT_S)
    assert proc.returncode is not None
    return Result(proc.returncode, out.decode(), err.decode())


def replica(url: str, node: str, log: Path, **env: str) -> ReplicaProcess:
    """A replica process (``hrwcron run``) with an HTTP endpoint on a free port."""
    base = {k: v for k, v in os.environ.items() if k not in HARNESS_ENV}
    base.update(
        {
            "HRWCRON_NATS_URL": url,
            "HRWCRON_NODE_ID": node,
            "HRWCRON_HTTP_LISTEN": "127.0.0.1:0",
            "HRWCRON_LOG_LEVEL": "info",
            **env,
        }
    )
    return ReplicaProcess(["run"], base, log, inherit_env=False)
