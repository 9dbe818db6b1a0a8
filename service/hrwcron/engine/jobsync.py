"""Declarative job sync: make the jobs bucket match a list of specs, showing the diff first."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hrwcron.core.errors import ConflictError
from hrwcron.core.model import JobSpec, encode
from hrwcron.engine.ports import JobEvent, JobsEditor


@dataclass
class JobDiff:
    create: list[JobSpec] = field(default_factory=list)
    update: list[tuple[JobSpec, int]] = field(default_factory=list)  # (new spec, revision read)
    delete: list[tuple[str, int]] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    # Not in the bucket and would never fire if written now (an @at or end that has passed):
    # left out, so a file re-applied after its one-time jobs ran does not bring them back.
    expired: list[tuple[str, str]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.create or self.update or self.delete)

    def lines(self) -> list[str]:
        return (
            [f"+ {s.name} ({s.schedule})" for s in self.create]
            + [f"~ {s.name} ({s.schedule})" for s, _ in self.update]
            + [f"- {name}" for name, _ in self.delete]
            + [f"= {name} (not created: {why})" for name, why in self.expired]
        )


async def diff_jobs(
    store: JobsEditor, specs: Sequence[JobSpec], *, prune: bool, now_ms: int | None = None
) -> JobDiff:
    """What to write so the bucket holds ``specs``. With ``now_ms``, a job missing from the
    bucket that would never fire from now on is not created (``expired``)."""
    current = await store.snapshot()
    diff = JobDiff()
    wanted = {spec.name: spec for spec in specs}
    for name, spec in wanted.items():
        existing = current.get(name)
        if existing is None or existing.spec is None:
            late = None if now_ms is None else spec.never_fires_problem(None, now_ms)
            if existing is None and late is not None:
                diff.expired.append((name, f"{late.where}: {late.message}"))
            elif existing is None:
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


@dataclass
class StartApply:
    """What a replica's start-up apply of its config file's jobs did."""

    written: list[str] = field(default_factory=list)  # diff lines of this replica's writes
    concurrent: list[str] = field(default_factory=list)  # found written by another replica
    left: list[str] = field(default_factory=list)  # warnings: a different spec kept winning


async def apply_at_start(
    store: JobsEditor, specs: Sequence[JobSpec], *, now_ms: int | None = None
) -> StartApply:
    """Write the config file's jobs the way replicas started together from one file can all do
    at once: losing a compare-and-set to another replica is not an error.

    A conflict is resolved by reading the job again: the same spec stored by someone else is
    success; a different one is replaced once, compare-and-set on the revision just read. A
    second conflict means other writers are storing a different spec right now (replicas
    started from different files): the job is left as they wrote it, with a warning, since
    overwriting in turn would only make the last replica to start win."""
    diff = await diff_jobs(store, specs, prune=False, now_ms=now_ms)
    result = StartApply()
    for spec in diff.create:
        await _converge(store, spec, 0, result, f"+ {spec.name} ({spec.schedule})")
    for spec, revision in diff.update:
        await _converge(store, spec, revision, result, f"~ {spec.name} ({spec.schedule})")
    return result


async def _converge(
    store: JobsEditor, spec: JobSpec, revision: int, result: StartApply, line: str
) -> None:
    wanted = encode(spec)
    current: JobEvent | None = None
    for _ in range(2):
        try:
            await store.put(spec, revision)
        except ConflictError:
            current = await store.get(spec.name)
            if current is not None and current.spec is not None and encode(current.spec) == wanted:
                result.concurrent.append(spec.name)
                return
            revision = 0 if current is None else current.revision
            continue
        result.written.append(line)
        return
    stored = f"revision {current.revision}" if current is not None else "a deletion"
    result.left.append(
        f"job {spec.name!r}: another writer stored a different spec ({stored}) while this "
        "replica applied its config file; left as stored (do the replicas share one file?)"
    )
