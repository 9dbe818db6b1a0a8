"""A test run killed from outside (a CI timeout, a double Ctrl-C) leaves nothing behind: the
nats-server and replica processes the harness started die with it, and the run directory with
every store and pytest's temporary directories is removed.

The killed run is a real pytest process, started the way CI starts one, with this suite's
conftest as a plugin and a test that starts a server (the ``nats_server`` fixture, whose store
is in tmp_path), a second server with a store of the harness's own choosing, and a replica,
then waits to be killed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from harness import marked_processes, wait_for

TESTS = Path(__file__).resolve().parents[1]
MARK = "HARNESS_TREE_MARK"
DEADLINE = 60.0

INNER_TEST = """
import json, os, threading
from pathlib import Path

from harness import NatsServer, ReplicaProcess, run_dir


def test_hold_until_killed(nats_server, tmp_path):
    replica = ReplicaProcess(
        ["run"],
        {
            "HRWCRON_NATS_URL": nats_server.url,
            "HRWCRON_NODE_ID": "orphan",
            "HRWCRON_HTTP_LISTEN": "",
        },
    )
    replica.wait_for_log(r"replica orphan started", 60)
    spare = NatsServer().start()
    report = {
        "pids": [nats_server.pid, spare.pid, replica.pid],
        "dirs": [str(run_dir()), str(tmp_path), str(spare.base_dir), str(replica.log_path)],
    }
    Path(os.environ["ORPHAN_REPORT"]).write_text(json.dumps(report))
    threading.Event().wait()
"""


def test_a_killed_test_run_leaves_no_process_and_no_store(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    report = tmp_path / "report.json"
    test_file = tmp_path / "inner" / "test_inner.py"
    test_file.parent.mkdir()
    test_file.write_text(INNER_TEST)
    env = {k: v for k, v in os.environ.items() if not k.startswith("HRWCRON_")}
    env.update({MARK: mark, "ORPHAN_REPORT": str(report), "PYTHONPATH": str(TESTS)})
    with open(tmp_path / "inner.log", "wb") as log:
        run = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pytest",
                "-p",
                "conftest",
                "-p",
                "no:cacheprovider",
                "--rootdir",
                str(test_file.parent),
                str(test_file),
            ],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(
            report.exists,
            timeout=DEADLINE,
            message=f"the inner run started its processes; its output:\n"
            f"{(tmp_path / 'inner.log').read_text(errors='replace')[-3000:]}",
        )
        started = json.loads(report.read_text())
        tree = set(marked_processes(MARK, mark))
        assert set(started["pids"]) <= tree, (started, tree)
        assert all(Path(d).exists() for d in started["dirs"])

        # Only the pytest process, as a runner's timeout would: its children are in sessions
        # of their own, so nothing else is signalled.
        os.kill(run.pid, signal.SIGKILL)
        run.wait(DEADLINE)

        wait_for(
            lambda: not marked_processes(MARK, mark),
            timeout=DEADLINE,
            message="every process of the killed run gone",
        )
        wait_for(
            lambda: not any(Path(d).exists() for d in started["dirs"]),
            timeout=DEADLINE,
            message=f"the killed run's directories removed: {started['dirs']}",
        )
    finally:
        for pid in marked_processes(MARK, mark):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if run.poll() is None:
            run.kill()
            run.wait()
