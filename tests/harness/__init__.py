"""Test harness: real nats-server processes, a fault-injecting TCP proxy, replica processes,
and deadline-bounded waiting. Import from here: ``from harness import NatsServer, wait_for``.
"""

from .nats import (
    LOOPBACK,
    NatsCluster,
    NatsServer,
    NatsServerError,
    TcpProxy,
    free_ports,
    nats_server_binary,
)
from .procs import (
    ExitStatus,
    FaketimeUnavailable,
    ReplicaProcess,
    faketime_available,
    faketime_env,
    find_libfaketime,
)
from .wait import wait_for, wait_for_async

__all__ = [
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
    "nats_server_binary",
    "wait_for",
    "wait_for_async",
]
