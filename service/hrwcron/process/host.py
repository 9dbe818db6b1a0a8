"""The replica's node id when the configuration names none: the name of the host it runs on.

Asking the machine for its name is I/O, so it happens here at the process's edge and not in
the pure configuration code, which leaves an unset node id empty.
"""

from __future__ import annotations

import socket

from hrwcron.core.config import Config, default_node_id


def host_node_id() -> str:
    """This host's name, made safe for a KV key."""
    return default_node_id(socket.gethostname())


def node_id(config: Config) -> str:
    """The node id ``config`` names, or this host's when it names none."""
    return config.scheduler.node_id or host_node_id()
