"""``hrwcron provision``: create or verify the buckets and the trigger stream ahead of time.

Replicas do the same at start-up, so running this is optional; it lets an operator create the
JetStream resources once, with an account that may create streams, and see what exists. It is
idempotent: existing resources are verified and never altered.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from hrwcron.cli.options import CONFIG, timeout
from hrwcron.cli.verb import Verb, arg
from hrwcron.core.config import Config, load_config, redact_url
from hrwcron.core.errors import HrwcronError, NatsSetupError
from hrwcron.process.logs import setup_logging

if TYPE_CHECKING:
    from nats.js import JetStreamContext
    from nats.js.api import StreamConfig

    from hrwcron.process.app import Stores

EXIT_FAILED = 1
EXIT_USAGE = 2
DEFAULT_TIMEOUT = 30.0
# What a worker group's consumer starts with: the worker SDK's defaults.
WORKER_ACK_WAIT = 30.0
WORKER_MAX_DELIVER = 5
_GROUP = re.compile(r"[A-Za-z0-9_-]{1,64}")


def worker_group(text: str) -> str:
    if not _GROUP.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"{text[:80]!r} is not a consumer name: 1-64 of letters, digits, _ and -"
        )
    return text


def _cmd_provision(args: argparse.Namespace) -> int:
    config = load_config(args.config, os.environ)
    setup_logging(config.telemetry.log_level, config.telemetry.log_format)
    groups: list[str] = args.worker_group or []
    subjects: list[str] = args.worker_subject or [f"{config.scheduler.subject_prefix}.>"]
    if args.worker_subject and not groups:
        print("hrwcron provision: --worker-subject needs --worker-group", file=sys.stderr)
        return EXIT_USAGE
    prefix = f"{config.scheduler.subject_prefix}."
    outside = [subject for subject in subjects if not subject.startswith(prefix)]
    if outside:
        print(
            f"hrwcron provision: --worker-subject {outside[0]!r} is outside the trigger "
            f"stream's subjects ({prefix}>)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    try:
        lines = asyncio.run(
            asyncio.wait_for(
                provision_report(config, groups, subjects, migrate=args.migrate), args.timeout
            )
        )
    except HrwcronError as exc:
        print(f"hrwcron provision: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except TimeoutError:
        # The client retries an unreachable server forever, as a replica should; a one-shot
        # command has to stop somewhere.
        servers = ", ".join(redact_url(url) for url in config.nats.servers)
        print(
            f"hrwcron provision: not done after {args.timeout:g} s; is NATS reachable at "
            f"{servers}?",
            file=sys.stderr,
        )
        return EXIT_FAILED
    sys.stdout.write("".join(f"{line}\n" for line in lines))
    return 0


def _resources(config: Config) -> list[tuple[str, str]]:
    """(label, JetStream stream name) of everything hrwcron keeps, in provisioning order."""
    from hrwcron.process.app import layout

    s = config.scheduler
    processed = layout(config).processed_bucket
    buckets = (
        s.members_bucket,
        s.claims_bucket,
        s.jobs_bucket,
        s.runs_bucket,
        s.counts_bucket,
        processed,
    )
    return [(f"bucket {b}", f"KV_{b}") for b in buckets] + [(f"stream {s.stream}", s.stream)]


async def provision_report(
    config: Config,
    groups: Sequence[str] = (),
    subjects: Sequence[str] = (),
    *,
    migrate: bool = False,
) -> list[str]:
    """Provision through :func:`hrwcron.process.app.open_stores` and describe each resource;
    then create or verify the durable pull consumer of each worker group in ``groups``; with
    ``migrate``, move jobs stored before lanes to their lanes' keys."""
    # Imported here so the other subcommands start without loading the NATS client.
    from nats.errors import TimeoutError as NatsTimeout
    from nats.js.errors import NotFoundError

    from hrwcron.adapters.jetstream.connect import connect
    from hrwcron.adapters.jetstream.provision import provision
    from hrwcron.core.model import DEFAULT_MAX_LATENESS
    from hrwcron.process.app import layout, open_stores

    resources = _resources(config)
    hint = _timeout_hint(resources[0][1])
    # Whether a resource existed is read on a first connection, before provisioning creates it;
    # another replica creating it in between only changes the wording, not the outcome.
    existed: dict[str, bool] = {}
    client = await connect(config.nats, name_suffix=":provision")
    try:
        js = client.jetstream()
        for _, name in resources:
            try:
                await js.stream_info(name)
                existed[name] = True
            except NotFoundError:
                existed[name] = False
    except NatsTimeout:
        raise NatsSetupError(hint) from None
    finally:
        await client.close()

    try:
        stores = await open_stores(config)
    except NatsTimeout:
        raise NatsSetupError(hint) from None
    try:
        js = stores.client.jetstream()
        # What replicas create at start-up is in place; now the worker SDK's bucket, and the
        # replicas and storage of everything (a replica at start-up does not refuse those).
        longest = max([job.max_lateness for job in config.jobs] + [DEFAULT_MAX_LATENESS])
        await provision(js, layout(config), longest, for_workers=True)
        lines = []
        for label, name in resources:
            info = await js.stream_info(name)
            state = "exists" if existed[name] else "created"
            lines.append(f"{label}: {state} ({_describe(info.config)})")
        for group in groups:
            lines.append(await worker_consumer(js, config.scheduler.stream, group, subjects))
        if migrate:
            lines.append(await migrate_jobs(stores))
        elif not stores.jobs.lanes:
            lines.append(
                f"bucket {config.scheduler.jobs_bucket}: jobs stored before lanes; once every "
                "replica runs this version, run hrwcron provision --migrate"
            )
        return lines
    finally:
        await stores.client.close()


async def migrate_jobs(stores: Stores) -> str:
    """Move every job stored under its bare name to its lane's key, refused while a replica
    of another version is live: older replicas read only bare-name keys."""
    from hrwcron import __version__

    others = sorted(
        f"{node} ({record.heartbeat.version})"
        for node, record in (await stores.members.snapshot()).items()
        if record.heartbeat.version != __version__
    )
    if others:
        raise NatsSetupError(
            f"replicas of another version are running: {', '.join(others)}; upgrade every "
            f"replica to {__version__} first, then run hrwcron provision --migrate again"
        )
    moved = await stores.jobs.migrate()
    return f"jobs: {moved} moved to their lanes; the bucket has lanes"


async def worker_consumer(
    js: JetStreamContext, stream: str, group: str, subjects: Sequence[str]
) -> str:
    """Create worker group ``group``'s durable pull consumer on ``stream`` when it is missing,
    as the worker SDK would with its defaults; an existing one must be a pull consumer. With
    the shipped accounts workers cannot create consumers: a push consumer's delivery subject
    is written by the server inside the scheduler's account."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    label = f"consumer {stream}/{group}"
    try:
        info = await js.consumer_info(stream, group)
    except NotFoundError:
        config = ConsumerConfig(
            durable_name=group,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=WORKER_ACK_WAIT,
            max_deliver=WORKER_MAX_DELIVER,
            max_ack_pending=1000,
            deliver_policy=DeliverPolicy.NEW,
            description="hrwcron worker",
        )
        if len(subjects) == 1:
            config.filter_subject = subjects[0]
        else:
            config.filter_subjects = list(subjects)
        info = await js.add_consumer(stream, config=config)
        state = "created"
    else:
        if info.config.deliver_subject:
            raise NatsSetupError(
                f"{label} is a push consumer (delivers to {info.config.deliver_subject!r}); "
                "workers pull: delete it, then run this again"
            )
        state = "exists"
    config = info.config
    filtered = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    return (
        f"{label}: {state} (pull, subjects {', '.join(filtered) or '(all)'}, "
        f"ack wait {_seconds(config.ack_wait or 30.0)}, max deliver {config.max_deliver})"
    )


def _timeout_hint(stream: str) -> str:
    return (
        f"no reply from the JetStream API (e.g. $JS.API.STREAM.INFO.{stream}): JetStream is "
        "not enabled for this account, or the NATS user lacks permission for it (see "
        "nats/accounts.conf)"
    )


def _seconds(value: float) -> str:
    for unit, size in (("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    return f"{value:g}s"


def _describe(config: StreamConfig) -> str:
    storage = getattr(config.storage, "value", config.storage)
    parts = [f"{storage} storage", f"replicas {config.num_replicas or 1}"]
    if not config.name or not config.name.startswith("KV_"):
        parts.insert(0, "subjects " + ", ".join(config.subjects or []))
        if config.duplicate_window:
            parts.append(f"duplicate window {_seconds(config.duplicate_window)}")
    if config.max_age:
        parts.append(f"max age {_seconds(config.max_age)}")
    return ", ".join(parts)


PROVISION = Verb(
    "provision",
    help="create or verify hrwcron's buckets and trigger stream",
    description=(
        "Connect to NATS as configured, check the server version, and create the members, "
        "claims, jobs and run-marker buckets, the worker SDK's processed bucket and the "
        "trigger stream when they are missing. Existing ones are verified, never changed; "
        "a setting that contradicts what hrwcron needs (including replicas or storage that "
        "differ from scheduler.replicas and scheduler.storage) is reported with what to "
        "change, and the command exits 1: so is one that would let the server write "
        "elsewhere (a republish rule, sources, a mirror, a subject transform, other "
        "subjects). With --worker-group it also creates each group's durable pull consumer. "
        "Prints one line per resource saying whether it was created or already existed."
    ),
    epilog=(
        "examples:\n  HRWCRON_NATS_URL=nats://nats-1:4222 hrwcron provision --config hrwcron.toml\n"
        "  hrwcron provision --worker-group reports --worker-subject 'hrwcron.trigger.reports.>'"
    ),
    args=(
        CONFIG,
        arg(
            "--worker-group",
            action="append",
            type=worker_group,
            metavar="NAME",
            help="also create (or verify) this worker group's durable pull consumer on the "
            "trigger stream, which workers of the shipped accounts may not create themselves; "
            "repeat for more groups",
        ),
        arg(
            "--worker-subject",
            action="append",
            metavar="SUBJECT",
            help="a trigger subject the groups' consumers take (default: every job's, "
            "<subject_prefix>.>); repeat for more",
        ),
        arg(
            "--migrate",
            action="store_true",
            help="move jobs stored by versions before lanes to their lanes' keys (every "
            "replica must run this version; refused otherwise); restart the replicas after it "
            "so they read only their lanes",
        ),
        arg(
            "--timeout",
            type=timeout,
            default=DEFAULT_TIMEOUT,
            metavar="SECONDS",
            help="give up after this long, e.g. with NATS unreachable "
            f"(default: {DEFAULT_TIMEOUT:g})",
        ),
    ),
    run=_cmd_provision,
)
