"""Child processes that die with the process that started them.

``hrwcron dev`` and the test harness start nats-server and replicas in sessions of their own, so
that a Ctrl-C reaches only the parent, which then stops them in order. The price is that nothing
stops them when the parent itself is killed (SIGKILL, a CI timeout, a crash): they would keep
running, and keep their ports and stores, with nobody left to stop them. On Linux the kernel can
send a child a signal when its parent goes (``PR_SET_PDEATHSIG``); elsewhere this does nothing.

The parent, for the kernel, is the thread that started the child: start children from a thread
that lives as long as they should (the main thread, or an event loop's executor).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: signal.Signals = signal.SIGKILL) -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that makes the child receive ``sig``
    when this process ends; None where the platform has no such thing."""
    if not sys.platform.startswith("linux"):
        return None
    # Looked up here, in the parent: the child must do as little as possible between fork and
    # exec (no imports, no allocations a lock held by another thread could block).
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    parent = os.getpid()
    number = int(sig)

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, number, 0, 0, 0)
        # The parent may have died between fork and prctl; then no signal would ever come.
        if os.getppid() != parent:
            os.kill(os.getpid(), number)

    return arm
