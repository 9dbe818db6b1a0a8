"""Declarative job sync: make the jobs bucket match a list of specs, showing the diff first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .model import JobSpec, encode
from .ports import JobsEditor


@dataclass
class JobDiff:
    create: list[JobSpec] = field(default_factory=list)
    update: list[tuple[JobSpec, int]] = field(default_factory=list)  # (new spec, revision read)
    delete: list[tuple[str, int]] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)

    def lines(self) -> list[str]:
        return (
            [f"+ {s.name} ({s.schedule})" for s in self.create]
            + [f"~ {s.name} ({s.schedule})" for s, _ in self.update]
            + [f"- {name}" for name, _ in self.delete]
        )


async def diff_jobs(store: JobsEditor, specs: Sequence[JobSpec], *, prune: bool) -> JobDiff:
    current = await store.snapshot()
    diff = JobDiff()
    wanted = {spec.name: spec for spec in specs}
    for name, spec in wanted.items():
        existing = current.get(name)
        if existing is None or existing.spec is None:
            if existing is None:
                diff.create.append(spec)
            else:  # a malformed stored value: replace it
                diff.update.append((spec, existing.revision))
        elif encode(existing.spec) != encode(spec):
            diff.update.append((spec, existing.revision))
        else:
            diff.unchanged.append(name)
    if prune:
        diff.delete = [(n, e.revision) for n, e in sorted(current.items()) if n not in wanted]
    return diff


async def apply_diff(store: JobsEditor, diff: JobDiff) -> None:
    """Every write is compare-and-set against what the diff read: a concurrent edit makes the
    apply fail with ConflictError instead of overwriting somebody else's change."""
    for spec in diff.create:
        await store.put(spec, 0)
    for spec, revision in diff.update:
        await store.put(spec, revision)
    for name, revision in diff.delete:
        await store.delete(name, revision)
