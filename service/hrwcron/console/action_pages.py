"""What the actions answer with: a backfill's dry run (and its button to publish), the
confirmation of an action on all matching jobs, and the outcome of a bulk action."""

from __future__ import annotations

from typing import Any

from hrwcron.admin.api import BackfillResult
from hrwcron.console.html import Viewer, button, e, form, job_url
from hrwcron.console.listing import ListQuery

SHOWN = 200  # the jobs a bulk result lists by name (the counts cover every one)


def bulk_result(what: str, done: str, names: list[str], outcomes: list[str]) -> str:
    """``outcomes[i]`` is what came of ``names[i]``: ``done`` ("paused", "resumed"), "no
    change" or "refused: ..."."""
    counts = {"changed": outcomes.count(done), "unchanged": outcomes.count("no change")}
    counts["refused"] = len(outcomes) - counts["changed"] - counts["unchanged"]
    told = ", ".join(f"{n:,} {k}" for k, n in counts.items())
    # Refusals first (the sort keeps the list's order otherwise): they need looking at.
    pairs = zip(names, outcomes, strict=True)
    ordered = sorted(pairs, key=lambda p: not p[1].startswith("refused"))
    items = [
        f'<li><a href="{e(job_url(name))}">{e(name)}</a>: '
        f'<span class="outcome">{e(outcome)}</span></li>'
        for name, outcome in ordered[:SHOWN]
    ]
    if len(ordered) > SHOWN:
        items.append(f"<li>… and {len(ordered) - SHOWN:,} more</li>")
    return (
        f"<h1>{e(what)}: {len(names):,} jobs</h1>"
        f'<p id="bulk-counts">{e(told)}</p><ul id="bulk-result">{"".join(items)}</ul>'
        '<p><a href="/jobs">back to the jobs</a></p>'
    )


def confirm_all(viewer: Viewer, what: str, query: ListQuery, total: int, confirmed: str) -> str:
    """Asks to confirm ``what`` for the ``total`` jobs ``query`` finds; ``confirmed`` is the
    count confirmed before, when the matches changed since."""
    hidden = "".join(
        f'<input type="hidden" name="{e(k)}" value="{e(v)}">'
        for k, v in {**query.criteria(), "action": what, "confirm": str(total)}.items()
    )
    changed = (
        f'<p class="bad" id="changed">The jobs matching changed since: '
        f"{e(confirmed[:20])} then, {total:,} now. Nothing was changed yet.</p>"
        if confirmed
        else ""
    )
    inner = hidden + button(f"{what} these {total:,} jobs", css="danger")
    return (
        f"<h1>{e(what.capitalize())} all matching jobs</h1>{changed}"
        f'<p id="confirm-count">{e(what.capitalize())} <b>{total:,}</b> '
        f"{'job' if total == 1 else 'jobs'}: every one matching {e(query.described())}, "
        "on every page of the list.</p>"
        + form(viewer, "/jobs/bulk-all", inner, css="confirm-all")
        + f'<p><a href="{e(query.url())}">cancel</a></p>'
    )


def _ticks(keys: list[str]) -> str:
    shown = "".join(f'<li class="mono">{e(k)}</li>' for k in keys[:50])
    more = f"<li>… and {len(keys) - 50} more</li>" if len(keys) > 50 else ""
    return f"<ul>{shown}{more}</ul>" if keys else '<p class="muted">none</p>'


def backfill(viewer: Viewer, reply: BackfillResult, asked: dict[str, Any]) -> str:
    name = reply.name
    head = (
        f'<h1>Backfill <span class="mono">{e(name)}</span></h1>'
        f'<p>from <span class="mono">{e(asked["from"])}</span> to '
        f'<span class="mono">{e(asked["to"])}</span>: {reply.due} due instants.</p>'
    )
    if reply.dry_run:
        verdict = f'<h2 id="dry-run">Dry run: would publish {len(reply.published)}</h2>'
    else:
        verdict = f'<h2 id="published">Published {len(reply.published)}</h2>'
    parts = [
        head,
        verdict,
        _ticks(reply.published),
        f"<h2>Already in the stream: {len(reply.present)}</h2>",
        _ticks(reply.present),
        f"<h2>Left to the scheduler (within max_lateness): {len(reply.left_to_scheduler)}</h2>",
        _ticks(reply.left_to_scheduler),
    ]
    if reply.dry_run and reply.published:
        inner = (
            f'<input type="hidden" name="from" value="{e(asked["from"])}">'
            f'<input type="hidden" name="to" value="{e(asked["to"])}">'
            f'<input type="hidden" name="step" value="publish">'
            + button(f"publish these {len(reply.published)} ticks", css="danger")
        )
        parts.append(form(viewer, f"{job_url(name)}/backfill", inner))
    parts.append(f'<p><a href="{e(job_url(name))}">back to the job</a></p>')
    return "".join(parts)
