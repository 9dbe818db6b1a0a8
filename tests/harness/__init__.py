"""Test harness: real nats-server processes, a fault-injecting TCP proxy, replica processes,
and deadline-bounded waiting. Import from here: ``from harness import NatsServer, wait_for``.
"""

from .buckets import live_keys
from .nats import (
    LOOPBACK,
    NatsCluster,
    NatsServer,
    NatsServerError,
    TcpProxy,
    free_ports,
    http_get,
    nats_server_binary,
)
from .procs import (
    ExitStatus,
    FaketimeUnavailable,
    ReplicaProcess,
    faketime_available,
    faketime_env,
    find_libfaketime,
    marked_processes,
)
from .rundir import KEEP_DIRS_ENV, keep_dirs, run_dir
from .wait import wait_for, wait_for_async

__all__ = [
    "KEEP_DIRS_ENV",
    "LOOPBACK",
    "ExitStatus",
    "FaketimeUnavailable",
    "NatsCluster",
    "NatsServer",
    "NatsServerError",
    "ReplicaProcess",
    "TcpProxy",
    "faketime_available",
    "faketime_env",
    "find_libfaketime",
    "free_ports",
    "http_get",
    "keep_dirs",
    "live_keys",
    "marked_processes",
    "nats_server_binary",
    "run_dir",
    "wait_for",
    "wait_for_async",
]
