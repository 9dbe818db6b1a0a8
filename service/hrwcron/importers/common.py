"""What both importers share: the report, job names derived stably and made unique, and the
check of every spec against the line it came from."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from hrwcron.core.errors import ImportSourceError, Problem
from hrwcron.core.model import JobSpec, job_name_problem

# Bounds on what one import reads, so a hostile file costs bounded work: a crontab or a
# manifest file is read up to this many bytes.
MAX_SOURCE_BYTES = 4 * 1024 * 1024
# Entries (crontab lines, CronJobs) one import turns into jobs: cronie's own bound on a user's
# crontab, and far more than one file of either kind holds.
MAX_ENTRIES = 10_000
_SLUG_LENGTH = 48
_SLUG_WORDS = 4


@dataclass
class Report:
    """The specs of an import, notes worth reading (what was skipped or read differently than
    one might expect) and the problems that stop it, each located as ``FILE:LINE``."""

    specs: list[JobSpec] = field(default_factory=list)
    notes: list[Problem] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)

    def specs_or_raise(self) -> list[JobSpec]:
        """Every spec, or :class:`ImportSourceError` with every problem and no spec."""
        if self.problems:
            raise ImportSourceError(self.problems)
        return self.specs


@dataclass
class Draft:
    """One entry of a source on its way to a spec: the name it asks for (``None``: derive one
    from ``slug``) and the spec's fields other than the name. A problem with the spec is
    reported at ``where``, or at the line of the field it is about (``lines``), after
    ``context``."""

    where: str
    name: str | None
    slug: str
    fields: dict[str, Any]
    context: str = ""
    lines: dict[str, str] = field(default_factory=dict)


def with_prefix(prefix: str | None, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


# Words that open a compound command, and commands that guard or prepare the real one
# (``test -x ... || run-parts ...``, ``cd /srv && ./run``): a slug skips past them.
_OPENERS = frozenset({"(", "{", "!", "if", "then", "else", "elif", "do", "while", "until"})
_GUARDS = frozenset({"cd", "test", "[", "[[", "true", ":"})


def command_slug(command: str) -> str:
    """A job-name token for a shell command: the first few words of its first simple command
    that does not guard or prepare another, paths cut to their last part, anything but
    letters and digits made ``-``. Only the command's text decides it, so an unchanged line
    keeps its name."""
    for segment in re.split(r"&&|\|\||[;|]", command):
        words = segment.split()
        while words and (words[0] in _OPENERS or re.match(r"[A-Za-z_][A-Za-z0-9_]*=", words[0])):
            words.pop(0)
        if not words or words[0] in _GUARDS:
            continue
        parts: list[str] = []
        for word in words:
            if re.match(r"[0-9]*[<>&]", word):
                break  # a redirection: what follows is where output goes, not what runs
            last = word.rstrip("/").rsplit("/", 1)[-1]
            part = re.sub(r"[^A-Za-z0-9]+", "-", last).strip("-").lower()
            if part:
                parts.append(part)
            if len(parts) == _SLUG_WORDS:
                break
        if parts:
            return "-".join(parts)[:_SLUG_LENGTH].rstrip("-")
    return "job"


def finish(report: Report, drafts: Sequence[Draft], prefix: str | None) -> None:
    """Name every draft (asked-for names as they are, derived ones made unique with ``-2``,
    ``-3``, ... in file order), build its spec and check it; a draft that breaks a rule adds
    its problems at its own line."""
    names = _unique_names(report, drafts, prefix)
    for draft, name in zip(drafts, names, strict=True):
        if name is None:
            continue
        spec = JobSpec(name=name, **draft.fields)
        found = spec.problems()
        for p in found:
            where = draft.lines.get(p.where.partition("[")[0], draft.where)
            report.problems.append(Problem(where, f"{draft.context}{p}"))
        if not found:
            report.specs.append(spec)


def _unique_names(report: Report, drafts: Sequence[Draft], prefix: str | None) -> list[str | None]:
    asked: dict[str, str] = {}
    for draft in drafts:
        if draft.name is None:
            continue
        name = with_prefix(prefix, draft.name)
        if name in asked:
            report.problems.append(
                Problem(
                    draft.where,
                    f"{draft.context}the job name {name!r} is already taken at {asked[name]}",
                )
            )
        asked.setdefault(name, draft.where)
    taken = set(asked)
    suffixes: dict[str, int] = {}  # the next suffix to try per slug, so repeats cost O(1)
    names: list[str | None] = []
    for draft in drafts:
        if draft.name is not None:
            name = with_prefix(prefix, draft.name)
        else:
            name = with_prefix(prefix, draft.slug)
            n = suffixes.get(draft.slug, 2)
            while name in taken:
                name = with_prefix(prefix, f"{draft.slug}-{n}")
                n += 1
            suffixes[draft.slug] = n
            taken.add(name)
        bad = job_name_problem(name)
        if bad:
            report.problems.append(Problem(draft.where, f"{draft.context}name: {bad}"))
            names.append(None)
        else:
            names.append(name)
    return names


def plain_json(value: Any) -> Any:
    """``value`` as the JSON it becomes (YAML's dates, sets and byte strings turned into what
    JSON has), so the spec printed, stored and compared by ``apply`` is the same."""
    return msgspec.json.decode(msgspec.json.encode(value))
