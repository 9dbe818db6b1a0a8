"""``hrwcron dev`` as a person at a terminal uses it: Ctrl-C (SIGINT to its process group) at
any point of its start-up stops every process it started and removes its temporary directory;
a second Ctrl-C while it stops kills everything at once; and killing it outright leaves no
nats-server or replica running.

Every process of the playground is found by a variable only this test's tree carries, so a
process that was re-parented after its parent died is still counted.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import ReplicaProcess, marked_processes, wait_for

MARK = "HARNESS_TREE_MARK"
DEADLINE = 30.0
# Ctrl-C must stop everything within a few seconds; the bound leaves room for a loaded machine.
STOPPED_WITHIN = 15.0
NATS_UP = r"^nats-server with JetStream at nats://"
REPLICA = re.compile(r"^replica (scheduler-\d+): pid (\d+)", re.MULTILINE)
ALL_JOINED = r"owners scheduler-0: \d+ jobs, scheduler-1: \d+ jobs, scheduler-2: \d+ jobs"
# A trigger line: stored at, job, due instant, lateness, the replica that fired it.
TRIGGER = re.compile(
    r"^\d\d:\d\d:\d\d\.\d{3}  (\S+)\s+(\d\d:\d\d:\d\d\.\d{3})\s+-?\d+ ms  scheduler-\d$",
    re.MULTILINE,
)


class Playground:
    def __init__(self, tmp_path: Path) -> None:
        self.mark = uuid.uuid4().hex
        # mkdtemp follows TMPDIR: the playground's directory must appear, and go, in here.
        self.tmp = tmp_path / "tmp"
        self.tmp.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("HRWCRON_")}
        env.update({MARK: self.mark, "TMPDIR": str(self.tmp)})
        self.dev = ReplicaProcess(["dev"], env, tmp_path / "dev.log", inherit_env=False)

    def processes(self) -> list[int]:
        return marked_processes(MARK, self.mark)

    def ctrl_c(self) -> None:
        # Not before the child has exec'd: between fork and exec the child still runs this
        # process's Python signal handler, which takes the signal and loses it with the exec,
        # and the playground would start as if nobody had pressed Ctrl-C.
        wait_for(
            lambda: b"hrwcron" in _proc(self.dev.pid, "cmdline"),
            timeout=DEADLINE,
            message="the playground's interpreter started",
        )
        os.killpg(self.dev.pid, signal.SIGINT)

    def replica_pids(self) -> dict[str, int]:
        return {name: int(pid) for name, pid in REPLICA.findall(self.dev.output())}

    def wait_all_gone(self) -> None:
        try:
            wait_for(lambda: not self.processes(), timeout=STOPPED_WITHIN, message="gone")
        except AssertionError:
            left = [f"{pid}: {_cmdline(pid)}" for pid in self.processes()]
            raise AssertionError(
                f"every process of the playground gone within {STOPPED_WITHIN:g} s; still "
                f"there: {left}; dev output:\n{self.dev.output()}"
            ) from None
        wait_for(
            lambda: not any(self.tmp.iterdir()),
            timeout=STOPPED_WITHIN,
            message=f"temporary directory removed: {sorted(self.tmp.iterdir())}",
        )

    def kill_everything(self) -> None:
        for pid in self.processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.dev.wait(10)


def _proc(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def _cmdline(pid: int) -> str:
    state = _proc(pid, "stat").decode(errors="replace").rsplit(")", 1)[-1].split()[:1]
    command = _proc(pid, "cmdline").replace(b"\0", b" ").decode(errors="replace").strip()
    return f"[{''.join(state)}] {command or '(gone)'}"


@pytest.fixture
def playground(tmp_path: Path) -> Iterator[Playground]:
    ground = Playground(tmp_path)
    try:
        yield ground
    finally:
        ground.kill_everything()


@pytest.mark.parametrize(
    "point",
    [None, NATS_UP, REPLICA.pattern, ALL_JOINED],
    ids=["during-interpreter-start", "nats-server-up", "replicas-starting", "all-joined"],
)
def test_ctrl_c_at_any_point_of_start_up_stops_everything(
    playground: Playground, point: str | None
) -> None:
    if point is not None:
        playground.dev.wait_for_log(point, DEADLINE)
    playground.ctrl_c()
    playground.wait_all_gone()
    assert playground.dev.wait(DEADLINE) is not None


def test_a_second_ctrl_c_stops_at_once(playground: Playground) -> None:
    playground.dev.wait_for_log(ALL_JOINED, DEADLINE)
    replicas = playground.replica_pids()
    assert len(replicas) == 3
    # A replica that cannot stop (here: paused) keeps the first Ctrl-C's orderly stop waiting.
    stuck = replicas.pop("scheduler-1")
    os.kill(stuck, signal.SIGSTOP)
    playground.ctrl_c()
    # The others stopped: the orderly stop is now waiting for the stuck one.
    wait_for(
        lambda: not set(replicas.values()) & set(playground.processes()),
        timeout=DEADLINE,
        message="the other replicas stopped",
    )
    assert stuck in playground.processes()
    playground.ctrl_c()
    playground.wait_all_gone()
    assert playground.dev.wait(DEADLINE) == 130
    assert "stopped at once" in playground.dev.output()


def test_killing_dev_kills_its_server_and_replicas(playground: Playground) -> None:
    playground.dev.wait_for_log(ALL_JOINED, DEADLINE)
    assert len(playground.processes()) >= 5  # dev, nats-server, three replicas
    os.kill(playground.dev.pid, signal.SIGKILL)
    wait_for(
        lambda: not playground.processes(),
        timeout=STOPPED_WITHIN,
        message="nats-server and replicas gone with their parent",
    )


def test_each_trigger_is_printed_once_as_the_stream_stored_it(playground: Playground) -> None:
    """Replicas started together do not know each other for their first tick, and more than
    one may publish it: the stream keeps one, and so does what the playground prints."""
    wait_for(
        lambda: len(TRIGGER.findall(playground.dev.output())) >= 30,
        timeout=DEADLINE,
        message="30 triggers printed",
    )
    printed = TRIGGER.findall(playground.dev.output())
    repeated = sorted({tick for tick in printed if printed.count(tick) > 1})
    assert not repeated, f"printed more than once: {repeated}"
    playground.ctrl_c()
    playground.wait_all_gone()
