"""The page of one job: where it stands, its next ticks and why, who fires it, its runs and
problems (one part the script refreshes when the job or its triggers change), its spec, and
the actions a signed-in user may take."""

from __future__ import annotations

from datetime import timedelta

from hrwcron.console.html import Viewer, button, e, form, job_url, until
from hrwcron.console.jobview import JobView, lateness_ms
from hrwcron.core.ticks import format_ms


def _offset(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"


def _standing(view: JobView) -> str:
    row = view.row
    if row is None:
        return f'<p class="bad" id="problem">not running here: {e(view.problem)}</p>'
    state = row.get("state") or "active"
    parts = [f'<span id="state" class="state {e(state)}">{e(state)}</span>']
    fire = row.get("next_fire_ms")
    if fire is not None:
        text = (
            f'fires next <span class="mono">{e(format_ms(fire))}</span> '
            f"({e(until(fire - view.now_ms))})"
        )
        if fire != row.get("next_due_ms"):
            text += f", due {e(row['next_due'])} plus jitter"
        parts.append(text)
    if row.get("runs_left") is not None:
        parts.append(f"{e(row['runs_left'])} of {e(row['max_runs'])} runs left")
    last = row.get("last")
    if last:
        parts.append(f'last trigger <span class="mono">{e(last["tick"])}</span>')
    text = " · ".join(parts)
    if view.problem:
        text += f'<p class="bad" id="problem">{e(view.problem)}</p>'
    return f'<p id="standing">{text}</p>'


def _order(view: JobView) -> str:
    order = (view.row or {}).get("failover") or []
    if not order:
        return '<p id="order" class="bad">no live member is eligible (tags)</p>'
    live = set(view.live)
    items = []
    for rank, node in enumerate(order):
        role = "owner: fires it" if rank == 0 else f"takes over after {rank} failover step(s)"
        mark = "" if node in live else ' <span class="bad">not live</span>'
        items.append(f'<li><b>{e(node)}</b> <span class="muted">{role}</span>{mark}</li>')
    return f'<ol id="order">{"".join(items)}</ol>'


def _next(view: JobView) -> str:
    rows = []
    for tick in view.ticks:
        if tick.rule is None:
            what = "fires"
            if tick.fire != tick.due:
                what += f" at {format_ms(tick.fire)} (jitter)"
        else:
            what = f'<span class="muted">excluded by <code>{e(tick.rule)}</code>'
            if tick.until:
                what += f", and every tick before {e(format_ms(tick.until))}"
            what += "</span>"
        if tick.offset_change:
            before, after = tick.offset_change
            what += f' <span class="note">DST: {_offset(before)} → {_offset(after)}</span>'
        rows.append(
            f'<tr><td class="mono">{e(format_ms(tick.due))}</td>'
            f'<td class="muted">{e(until(tick.due - view.now_ms))}</td><td>{what}</td></tr>'
        )
    if not rows:
        rows.append('<tr><td colspan="3" class="muted">no tick ahead</td></tr>')
    ending = f'<p class="muted">{e(view.ending)}</p>' if view.ending else ""
    notes = "".join(f"<li>{e(n)}</li>" for n in view.notes)
    return (
        '<table id="next"><thead><tr><th>due (UTC)</th><th></th><th>why</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>{ending}"
        + (f'<ul id="notes">{notes}</ul>' if notes else "")
    )


def _history(view: JobView) -> str:
    if view.history_error:
        return f'<p class="bad">{e(view.history_error)}</p>'
    history = view.history
    if history is None or not history.triggers:
        return '<p id="runs" class="muted">no triggers in the stream</p>'
    rows = []
    for t in history.triggers:
        late = lateness_ms(t)
        rows.append(
            f'<tr class="run"><td class="num">{e(t.seq)}</td><td class="mono">{e(t.tick)}</td>'
            f'<td>{e(t.kind)}</td><td class="mono">{e(t.due)}</td>'
            f'<td class="num">{"" if late is None else e(f"{late:.0f} ms")}</td>'
            f'<td>{e(t.node)}</td><td class="num">{e(t.attempt)}</td></tr>'
        )
    older = ""
    if history.next:
        older = f'<a id="older" href="{e(job_url(view.name, before=history.next))}">older →</a>'
    return (
        '<table id="runs"><thead><tr><th>seq</th><th>tick</th><th>kind</th><th>due (UTC)</th>'
        "<th>late</th><th>fired by</th><th>attempt</th></tr></thead>"
        f'<tbody>{"".join(rows)}</tbody></table><p class="pages">'
        f'<a href="{e(job_url(view.name))}">newest</a> {older}</p>'
    )


def _troubles(view: JobView) -> str:
    if not view.troubles and not view.problem:
        return '<p id="troubles" class="muted">none seen by this replica</p>'
    items = [
        f"<li><b>{e(t.outcome)}</b> tick due {e(format_ms(t.due_ms))}, "
        f"{e(until(t.at_ms - view.now_ms))}</li>"
        for t in view.troubles
    ]
    if view.problem:
        items.insert(0, f'<li class="bad">{e(view.problem)}</li>')
    return f'<ul id="troubles">{"".join(items)}</ul>'


def live_part(view: JobView) -> str:
    """What changes while the page is open; the script fetches it again on a change."""
    return (
        f'<section id="live">{_standing(view)}'
        f"<h2>Who fires it</h2>{_order(view)}"
        f"<h2>Next ticks, and why</h2>{_next(view)}"
        f"<h2>Runs (from the trigger stream, newest first)</h2>{_history(view)}"
        f"<h2>Recent problems</h2>{_troubles(view)}</section>"
    )


def _actions(view: JobView, viewer: Viewer) -> str:
    if not viewer.signed_in:
        return '<p class="muted" id="actions">read-only: sign in to pause, trigger or backfill</p>'
    url = job_url(view.name)
    paused = bool(view.entry and view.entry.spec and view.entry.spec.paused)
    toggle = (
        form(viewer, f"{url}/resume", button("resume", css="primary"))
        if paused
        else form(viewer, f"{url}/pause", button("pause"))
    )
    trigger = form(
        viewer,
        f"{url}/trigger",
        '<label>trigger now, id <input name="id" size="18" placeholder="(generated)" '
        'pattern="[A-Za-z0-9_\\-]{1,64}"></label> ' + button("trigger"),
    )
    backfill = form(
        viewer,
        f"{url}/backfill",
        '<label>backfill from <input name="from" required placeholder="2026-03-01T00:00:00Z">'
        '</label> <label>to <input name="to" required placeholder="2026-03-02T00:00:00Z">'
        "</label> " + button("dry run first"),
    )
    delete = f'<a class="danger" href="{e(url)}/delete">delete…</a>'
    return f'<div id="actions">{toggle}{trigger}{backfill}<p>{delete}</p></div>'


def page_body(view: JobView, viewer: Viewer, done: str = "") -> str:
    entry = view.entry
    description = entry.spec.description if entry and entry.spec else ""
    note = f'<p id="done" class="ok">{e(done)}</p>' if done else ""
    spec = (
        f'<pre id="spec">{e(view.spec_json)}</pre>'
        if view.spec_json
        else f'<p class="bad">{e(view.problem)}</p>'
    )
    facts = [e(description)] if description else []
    if entry:
        facts.append(f"revision {e(entry.revision)}")
    return (
        f'<h1>Job <span id="job-name" class="mono">{e(view.name)}</span></h1>'
        f'<p class="muted">{" · ".join(facts)}</p>{note}'
        f"{_actions(view, viewer)}{live_part(view)}<h2>Spec</h2>{spec}"
    )
