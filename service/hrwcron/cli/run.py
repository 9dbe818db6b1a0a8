"""The service commands of the CLI: ``run`` (one replica) and ``dev`` (a local playground)."""

from __future__ import annotations

import argparse
import asyncio
import os

from hrwcron.cli.options import CONFIG
from hrwcron.cli.verb import Verb, arg
from hrwcron.core.config import load_config
from hrwcron.process.logs import setup_logging


def _cmd_run(args: argparse.Namespace) -> int:
    from hrwcron.process.app import node_id, serve

    config = load_config(args.config, os.environ)
    setup_logging(config.telemetry.log_level, config.telemetry.log_format, node_id(config))
    return asyncio.run(serve(config, os.environ))


def _cmd_dev(args: argparse.Namespace) -> int:
    from hrwcron.process.dev import run_dev

    return run_dev(args.replicas)


RUN = Verb(
    "run",
    help="run one scheduler replica",
    description=(
        "Run one scheduler replica until SIGTERM or SIGINT. Configuration comes from "
        "--config (TOML) overlaid with HRWCRON_* environment variables, e.g. "
        "HRWCRON_NATS_URL and HRWCRON_NODE_ID (default: the host name)."
    ),
    args=(CONFIG,),
    run=_cmd_run,
    raw=False,
)

DEV = Verb(
    "dev",
    help="local playground: embedded nats-server, 3 replicas, sample jobs, live triggers",
    description=(
        "Start an embedded nats-server with JetStream in a temporary directory, three "
        "scheduler replicas as separate processes and sample jobs, and print every "
        "trigger as it arrives plus membership changes. Ctrl-C stops everything."
    ),
    args=(arg("--replicas", type=int, default=3, help="how many replicas (default: 3)"),),
    run=_cmd_dev,
    raw=False,
)
