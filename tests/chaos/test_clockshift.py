"""The tracer that moves a nats-server's clock (``harness/clock_files.py``, ``clockshift.c``),
on a small Python child: its wall clock follows the file while it runs, its monotonic clock
does not, signals reach it and its exit status comes back; and on a real nats-server, whose
own report of the time (``/varz``) follows the file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from harness import NatsServer, wait_for
from harness.clock_files import needs_clockshift, shifted_command, write_clock

CHILD = """
import sys, time
for line in sys.stdin:
    if line.strip() == "exit":
        sys.exit(7)
    print(time.time(), time.monotonic(), flush=True)
"""


def ask(child: subprocess.Popen[str]) -> tuple[float, float]:
    """The child's wall clock minus ours, and its monotonic clock minus ours, in seconds."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("now\n")
    child.stdin.flush()
    wall, mono = map(float, child.stdout.readline().split())
    return wall - time.time(), mono - time.monotonic()


@needs_clockshift
def test_a_program_under_clockshift_follows_the_file_on_its_wall_clock_only(
    tmp_path: Path,
) -> None:
    clock = tmp_path / "clock"
    write_clock(clock, 3600)
    command = shifted_command(clock, [sys.executable, "-c", CHILD])
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        wall, mono = ask(child)
        assert abs(wall - 3600) < 0.5 and abs(mono) < 0.5
        write_clock(clock, -30)  # a step while it runs: the tracer rereads every 20 ms
        wait_for(lambda: abs(ask(child)[0] + 30) < 0.5, timeout=5, message="the step taken")
        wall, mono = ask(child)
        assert abs(wall + 30) < 0.5 and abs(mono) < 0.5
        assert child.stdin is not None
        child.stdin.write("exit\n")
        child.stdin.flush()
        assert child.wait(10) == 7  # the program's exit status, through the tracer


@needs_clockshift
def test_a_signal_to_the_tracer_reaches_the_program(tmp_path: Path) -> None:
    command = shifted_command(tmp_path / "clock", [sys.executable, "-c", CHILD])
    with subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        ask(child)  # running
        child.send_signal(signal.SIGTERM)
        assert child.wait(10) == 128 + signal.SIGTERM


@needs_clockshift
def test_a_nats_server_reports_the_time_its_clock_file_says(tmp_path: Path) -> None:
    clock = tmp_path / "clock"
    server = NatsServer(base_dir=tmp_path / "n", clock_file=clock).start()
    try:
        write_clock(clock, 7200)

        def ahead() -> float:
            now = datetime.fromisoformat(server.varz()["now"].replace("Z", "+00:00"))
            return now.timestamp() - time.time()

        wait_for(lambda: abs(ahead() - 7200) < 1.0, timeout=5, message="the server 2 h ahead")
    finally:
        server.cleanup()
