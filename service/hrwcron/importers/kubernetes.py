"""Kubernetes CronJob manifests as job specs, read the way the CronJob controller reads them.

Files hold one or more YAML documents, each an object or a list of them (``kubectl get
cronjobs -o yaml`` gives a ``List`` with ``items``). A CronJob (``batch/v1``) becomes one job
named ``<namespace>.<name>``: ``spec.schedule`` in the controller's parser (robfig/cron v3,
five fields or a macro, see :mod:`.fields`), ``spec.timeZone`` (else the controller's zone,
``tz``), ``suspend`` as ``paused``, ``concurrencyPolicy: Forbid`` as ``overlap = "skip"``,
``startingDeadlineSeconds`` as ``max_lateness``, and ``catchup = "latest"``: after an outage
the controller starts only the most recent missed run. The job template goes into the payload
with the namespace and the CronJob's name; labels become tags only when asked (tags decide
which replicas may run a job). Other objects are skipped with a note.

Parsing is bounded: files are read up to :data:`MAX_SOURCE_BYTES`, at most
:data:`MAX_OBJECTS` objects in all, and YAML aliases may not expand a document past
:data:`MAX_EXPANDED_NODES` nodes (an alias is one node in memory but a copy in JSON).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import yaml

from hrwcron.core.config import SchedulerConfig
from hrwcron.core.errors import HrwcronError, Problem, ScheduleError
from hrwcron.core.model import DEFAULT_MAX_LATENESS, tag_problem, tz_problem
from hrwcron.importers.common import (
    MAX_ENTRIES,
    MAX_SOURCE_BYTES,
    Draft,
    Report,
    finish,
    plain_json,
)
from hrwcron.importers.fields import ROBFIG_FIELDS, restricted, robfig_field

MAX_OBJECTS = MAX_ENTRIES
MAX_EXPANDED_NODES = 1_000_000
_API_VERSIONS = ("batch/v1", "batch/v1beta1")
_DESCRIPTORS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_POLICIES = {"Allow": "allow", "Forbid": "skip"}
# A replica refuses a job whose lateness window outlasts the trigger stream's deduplication.
_DUPLICATE_WINDOW = SchedulerConfig().duplicate_window
# Where in a CronJob each job field comes from, to report a problem with it at its line.
_FIELD_PATHS = {
    "schedule": ("spec", "schedule"),
    "tz": ("spec", "timeZone"),
    "payload": ("spec", "jobTemplate"),
    "max_lateness": ("spec", "startingDeadlineSeconds"),
    "tags": ("metadata", "labels"),
}


@dataclass(frozen=True)
class KubernetesOptions:
    """``tz``: the zone of the controller (kube-controller-manager) for CronJobs without
    ``spec.timeZone``; ``labels_as_tags``: each label ``k=v`` becomes the tag ``k=v`` (``/``
    written ``:``); ``prefix``: put before every job name."""

    tz: str = "UTC"
    labels_as_tags: bool = False
    prefix: str | None = None


class _ObjectError(HrwcronError):
    """Why one CronJob cannot become a job, at the line of the field it is about."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line


def read_manifests(
    files: Sequence[tuple[str, bytes]], options: KubernetesOptions | None = None
) -> Report:
    """The jobs of the CronJobs in ``files`` (each its name for messages and its bytes)."""
    options = options or KubernetesOptions()
    report = Report()
    drafts: list[Draft] = []
    seen = 0
    for source, data in files:
        if len(data) > MAX_SOURCE_BYTES:
            report.problems.append(
                Problem(source, f"is more than {MAX_SOURCE_BYTES} bytes, the most one file may be")
            )
            continue
        try:
            for node, obj in _objects(data):
                seen += 1
                if seen > MAX_OBJECTS:
                    raise _ObjectError(
                        _line(node), f"more than {MAX_OBJECTS} objects in all; import fewer at once"
                    )
                _object(report, drafts, source, node, obj, options)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f"{source}:{mark.line + 1}" if mark else source
            report.problems.append(Problem(where, f"is not valid YAML: {exc.problem or exc}"))
        except yaml.YAMLError as exc:
            report.problems.append(Problem(source, f"is not valid YAML: {exc}"))
        except RecursionError:
            report.problems.append(Problem(source, "nests YAML too deeply to read"))
        except _ObjectError as exc:
            report.problems.append(Problem(f"{source}:{exc.line}", str(exc)))
            if seen > MAX_OBJECTS:
                break
    finish(report, drafts, options.prefix)
    return report


def _objects(data: bytes) -> Iterator[tuple[yaml.Node, Any]]:
    """Each object of each document, with its node (for line numbers); a list's items."""
    loader = yaml.SafeLoader(data)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            _check_expansion(node)
            value = loader.construct_document(node)
            if isinstance(value, dict) and str(value.get("kind", "")).endswith("List"):
                items = value.get("items")
                nodes = _child(node, "items")
                if isinstance(items, list) and isinstance(nodes, yaml.SequenceNode):
                    yield from zip(nodes.value, items, strict=True)
                    continue
            if value is not None:
                yield node, value
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a document whose aliases would expand it past the bound, or refer to itself."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = _children(node)
        if done:
            open_nodes.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in children)
            if size[key] > MAX_EXPANDED_NODES:
                raise _ObjectError(
                    root.start_mark.line + 1,
                    f"its aliases expand this document past {MAX_EXPANDED_NODES} nodes",
                )
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise _ObjectError(node.start_mark.line + 1, "a YAML alias refers to itself")
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in size)


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _child(node: yaml.Node | None, *path: str) -> yaml.Node | None:
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None
        node = next((v for k, v in node.value if k.value == key), None)
    return node


def _line(node: yaml.Node, *path: str) -> int:
    found = _child(node, *path)
    return (found or node).start_mark.line + 1


def _object(
    report: Report,
    drafts: list[Draft],
    source: str,
    node: yaml.Node,
    obj: Any,
    options: KubernetesOptions,
) -> None:
    where = f"{source}:{_line(node)}"
    if not isinstance(obj, dict):
        report.notes.append(Problem(where, "skipped: not a Kubernetes object (no mapping)"))
        return
    kind, meta = obj.get("kind"), obj.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    name, namespace = meta.get("name"), meta.get("namespace") or "default"
    if kind != "CronJob":
        report.notes.append(
            Problem(
                where,
                f"skipped {kind or 'an object without a kind'} {name or ''}".rstrip()
                + " (not a CronJob)",
            )
        )
        return
    found: list[tuple[int, str]] = []
    notes: list[tuple[int, str]] = []
    if obj.get("apiVersion") not in _API_VERSIONS:
        found.append(
            (
                _line(node, "apiVersion"),
                f"apiVersion {obj.get('apiVersion')!r}: CronJobs are read as batch/v1",
            )
        )
    if not isinstance(name, str) or not name:
        found.append((_line(node, "metadata"), "metadata.name is missing or not a string"))
    spec = obj.get("spec")
    fields: dict[str, Any] = {}
    if isinstance(spec, dict):
        fields = _fields(node, spec, options, found, notes)
    else:
        found.append((_line(node, "spec"), "spec is missing or not a mapping"))
    labels = meta.get("labels")
    if options.labels_as_tags and isinstance(labels, dict):
        fields["tags"] = _tags(node, labels, found)
    if isinstance(spec, dict):
        payload = {"namespace": namespace, "cronjob": name, "jobTemplate": spec.get("jobTemplate")}
        try:
            fields["payload"] = plain_json(payload)
        except (TypeError, msgspec.EncodeError) as exc:  # a key JSON has no place for
            found.append(
                (_line(node, "spec", "jobTemplate"), f"spec.jobTemplate is not JSON: {exc}")
            )
    who = f"CronJob {namespace}/{name}" if isinstance(name, str) and name else "CronJob"
    found.sort(key=lambda problem: problem[0])
    report.problems += [Problem(f"{source}:{line}", f"{who}: {why}") for line, why in found]
    report.notes += [Problem(f"{source}:{line}", f"{who}: {why}") for line, why in notes]
    if found or not isinstance(spec, dict):
        return
    lines = {
        key: f"{source}:{_line(node, *path)}"
        for key, path in _FIELD_PATHS.items()
        if _child(node, *path) is not None
    }
    drafts.append(Draft(where, f"{namespace}.{name}", str(name), fields, f"{who}: ", lines))


def _tags(node: yaml.Node, labels: dict[Any, Any], found: list[tuple[int, str]]) -> list[str]:
    """Each label ``k: v`` as the tag ``k=v``, ``/`` (not allowed in a tag) written ``:``."""
    tags = []
    for key, value in labels.items():
        tag = f"{key}={value}".replace("/", ":")
        bad = tag_problem(tag)
        if bad:
            found.append((_line(node, "metadata", "labels"), f"label {key}={value}: {bad}"))
        tags.append(tag)
    return sorted(tags)


def _fields(
    node: yaml.Node,
    spec: dict[str, Any],
    options: KubernetesOptions,
    found: list[tuple[int, str]],
    notes: list[tuple[int, str]],
) -> dict[str, Any]:
    """The job's fields from the CronJob's spec; what cannot be expressed goes to ``found``
    and what the replicas may refuse with their settings to ``notes``, each with the line of
    its field."""

    def at(key: str) -> int:
        return _line(node, "spec", key)

    fields: dict[str, Any] = {"catchup": "latest"}
    schedule = spec.get("schedule")
    if not isinstance(schedule, str):
        found.append((at("schedule"), "spec.schedule is missing or not a string"))
    else:
        try:
            fields["schedule"] = cronjob_schedule(schedule)
        except ScheduleError as exc:
            found.append((at("schedule"), f"spec.schedule {schedule!r}: {exc}"))
    tz = spec.get("timeZone")
    if tz is None:
        fields["tz"] = options.tz
    else:
        bad = "must not be 'Local'" if str(tz).lower() == "local" else tz_problem(str(tz))
        if not isinstance(tz, str) or bad:
            found.append((at("timeZone"), f"spec.timeZone: {bad or 'must be a string'}"))
        fields["tz"] = tz
    policy = spec.get("concurrencyPolicy") or "Allow"
    if policy == "Replace":
        found.append(
            (
                at("concurrencyPolicy"),
                "concurrencyPolicy Replace (stop the running Job and start the new one) is not "
                "supported: hrwcron can skip a tick while the last run goes on (Forbid) or let "
                "runs overlap (Allow)",
            )
        )
    elif not isinstance(policy, str) or policy not in _POLICIES:
        found.append(
            (
                at("concurrencyPolicy"),
                f"concurrencyPolicy {policy!r} is not Allow, Forbid or Replace",
            )
        )
    else:
        fields["overlap"] = _POLICIES[policy]
    deadline = spec.get("startingDeadlineSeconds")
    if deadline is None:
        fields["max_lateness"] = DEFAULT_MAX_LATENESS
    elif isinstance(deadline, int) and not isinstance(deadline, bool) and 0 < deadline <= 86_400:
        fields["max_lateness"] = float(deadline)
        if deadline > _DUPLICATE_WINDOW:
            notes.append(
                (
                    at("startingDeadlineSeconds"),
                    f"startingDeadlineSeconds {deadline}: replicas take a max_lateness up to "
                    f"their scheduler.duplicate_window ({_DUPLICATE_WINDOW:g} s unless set)",
                )
            )
    else:
        found.append(
            (
                at("startingDeadlineSeconds"),
                f"startingDeadlineSeconds {deadline!r}: hrwcron's max_lateness is a whole "
                "number of seconds from 1 to 86400 here",
            )
        )
    suspend = spec.get("suspend")
    if suspend is not None and not isinstance(suspend, bool):
        found.append((at("suspend"), f"suspend {suspend!r} is not true or false"))
    fields["paused"] = suspend is True
    return fields


def cronjob_schedule(text: str) -> str:
    """``spec.schedule`` as Kubernetes validates it and the controller reads it
    (``cron.ParseStandard``), in hrwcron's terms."""
    if "TZ" in text:
        raise _schedule_problem(
            "Kubernetes refuses TZ or CRON_TZ in spec.schedule: give the zone as spec.timeZone"
        )
    if not text:
        raise _schedule_problem("empty")
    if text.startswith("@"):
        if text in _DESCRIPTORS:
            return text
        if text.startswith("@every "):
            raise _schedule_problem(
                "@every counts from when the controller first saw the CronJob, hrwcron's from "
                "the Unix epoch, so the instants would differ: write it as cron fields"
            )
        raise _schedule_problem(f"unrecognized descriptor {text!r}: " + " ".join(_DESCRIPTORS))
    parts = text.split()
    if len(parts) != 5:
        raise _schedule_problem(f"expected exactly 5 fields, found {len(parts)}")
    read = [robfig_field(p, f) for p, f in zip(parts, ROBFIG_FIELDS, strict=True)]
    texts = [text for text, _ in read]
    dom_star, dow_star = read[2][1], read[4][1]
    if not dom_star and not dow_star:  # both restricted: the OR rule, in hrwcron's terms too
        texts[2] = restricted(texts[2], ROBFIG_FIELDS[2])
        texts[4] = restricted(texts[4], ROBFIG_FIELDS[4])
    return " ".join(texts)


def _schedule_problem(message: str) -> ScheduleError:
    return ScheduleError(Problem("", message))
