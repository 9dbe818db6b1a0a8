"""The job list page: the search form, then the results (a part of its own, which the script
fetches as a person types and when the jobs change), with bulk pause and resume of the jobs
chosen on the page or of every job the search finds."""

from __future__ import annotations

from typing import Any

from hrwcron.console.actions import MAX_ALL
from hrwcron.console.html import Viewer, button, e, form, job_url, until
from hrwcron.console.listing import STATES, ListQuery, ListResult
from hrwcron.core.ticks import format_ms


def _state_cell(row: dict[str, Any]) -> str:
    state = row.get("state") or "active"
    text = f'<span class="state {e(state)}">{e(state)}</span>'
    if row.get("bad") and state != "bad":
        text += ' <span class="state bad" title="see the job">bad</span>'
    return text


def _due_cell(row: dict[str, Any], now_ms: int) -> str:
    fire = row.get("next_fire_ms")
    if fire is None:
        return '<span class="muted">—</span>'
    text = f'<span class="mono">{e(format_ms(fire))}</span><br>'
    text += f'<span class="muted">{e(until(fire - now_ms))}'
    if fire != row.get("next_due_ms"):
        text += f", due {e(row.get('next_due', ''))[11:19]} + jitter"
    return text + "</span>"


def _last_cell(row: dict[str, Any]) -> str:
    last = row.get("last")
    if not last:
        return '<span class="muted">none yet</span>'
    text = f'<span class="mono">{e(last["tick"])}</span>'
    if last.get("lateness_ms") is not None:
        text += f'<br><span class="muted">{e(last["lateness_ms"])} ms late, by {e(last["by"])}'
        text += "</span>"
    return text


def _row(row: dict[str, Any], now_ms: int, selectable: bool) -> str:
    name = row["name"]
    pick = (
        f'<td><input type="checkbox" name="name" value="{e(name)}" '
        f'aria-label="select {e(name)}"></td>'
        if selectable
        else ""
    )
    if "schedule" not in row:  # a stored spec the replica could not load
        return (
            f'<tr class="job">{pick}<td><a class="job-link" href="{e(job_url(name))}">'
            f"{e(name)}</a></td>"
            f'<td colspan="5" class="bad">{e(row.get("problem"))}</td><td>{_state_cell(row)}</td>'
            "</tr>"
        )
    order = row.get("failover") or []
    owner = e(order[0]) if order else '<span class="bad">nobody eligible</span>'
    then = " → ".join(e(n) for n in order[1:])
    return (
        f'<tr class="job">{pick}<td><a class="job-link" href="{e(job_url(name))}">{e(name)}</a>'
        f'<br><span class="muted">{e(row.get("description"))}</span></td>'
        f'<td><span class="mono">{e(row["schedule"])}</span><br>'
        f'<span class="muted">{e(row["tz"])}</span></td>'
        f'<td>{owner}<br><span class="muted">{then or "—"}</span></td>'
        f"<td>{_due_cell(row, now_ms)}</td><td>{_last_cell(row)}</td>"
        f"<td>{e(', '.join(row.get('tags') or []))}</td><td>{_state_cell(row)}</td></tr>"
    )


def results(viewer: Viewer, found: ListResult, now_ms: int) -> str:
    """The part the script replaces: counts, the bulk actions, the table, the pages."""
    q = found.query
    shown = len(found.rows)
    first = q.start + 1 if shown else 0
    summary = (
        f'<p id="count"><b>{found.total:,}</b> {"job" if found.total == 1 else "jobs"} match'
        f' <span class="muted">· showing {first:,}–{q.start + shown:,} · found in '
        f"{found.took_ms:.0f} ms · jobs revision {found.revision}</span></p>"
    )
    selectable = viewer.signed_in
    head = (
        ('<th><input type="checkbox" id="select-all" aria-label="select every job shown"></th>')
        if selectable
        else ""
    )
    body = "".join(_row(row, now_ms, selectable) for row in found.rows)
    if not body:
        cols = 8 if selectable else 7
        body = f'<tr><td colspan="{cols}" class="muted">no job matches</td></tr>'
    table = (
        f'<table id="jobs"><thead><tr>{head}<th>job</th><th>schedule</th>'
        "<th>owner, then failover</th><th>fires next (UTC)</th><th>last trigger</th>"
        f"<th>tags</th><th>state</th></tr></thead><tbody>{body}</tbody></table>"
    )
    pages = []
    if q.start > 0:
        pages.append(f'<a id="prev" href="{e(q.url(start=max(0, q.start - q.limit)))}">← prev</a>')
    if q.start + shown < found.total:
        pages.append(f'<a id="next" href="{e(q.url(start=q.start + q.limit))}">next →</a>')
    nav = f'<p class="pages">{" · ".join(pages)}</p>' if pages else ""
    if selectable:
        actions = (
            '<p class="bulk">with the selected jobs: '
            + button("pause", "action", "pause")
            + " "
            + button("resume", "action", "resume")
            + "</p>"
        )
        table = form(viewer, "/jobs/bulk", actions + table, css="bulk-form")
        table = _all_matching(viewer, q, found.total) + table
    if found.elsewhere:
        name = found.elsewhere
        summary += (
            f'<p id="elsewhere">{e(name)} is held by other replicas: '
            f'<a href="/jobs/{e(name)}">open its page</a></p>'
        )
    if found.share:
        summary += f'<p id="share" class="muted">{e(found.share)}</p>'
    return f'<section id="results" data-revision="{found.revision}">{summary}{table}{nav}</section>'


def _all_matching(viewer: Viewer, q: ListQuery, total: int) -> str:
    """Pause or resume every job the search and filters find, on every page: a form that
    leads to a confirmation naming the count (the server refuses past MAX_ALL as well)."""
    if not total:
        return ""
    if total > MAX_ALL:
        return (
            f'<p class="bulk-all muted">{total:,} jobs match: pausing or resuming all matching '
            f"jobs takes at most {MAX_ALL:,} at once; narrow the search.</p>"
        )
    hidden = "".join(
        f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in q.criteria().items()
    )
    noun = "job" if total == 1 else "jobs"
    inner = (
        hidden
        + f"with all {total:,} matching {noun} (every page): "
        + button(f"pause all {total:,}", "action", "pause")
        + " "
        + button(f"resume all {total:,}", "action", "resume")
    )
    return form(viewer, "/jobs/bulk-all", f'<p class="bulk">{inner}</p>', css="bulk-all")


def search_form(q: ListQuery, members: list[str]) -> str:
    states = "".join(
        f'<option value="{s}"{" selected" if q.state == s else ""}>{s}</option>' for s in STATES
    )
    owners = "".join(
        f'<option value="{e(m)}"{" selected" if q.owner == m else ""}>{e(m)}</option>'
        for m in members
    )
    missed = " checked" if q.missed else ""
    return (
        '<form id="search" method="get" action="/jobs" role="search">'
        f'<input id="q" type="search" name="q" value="{e(q.q)}" placeholder="name or part of it"'
        ' autocomplete="off" autofocus aria-label="job name">'
        f' <label>state <select name="state"><option value="">any</option>{states}</select>'
        f'</label> <label>tag <input name="tag" value="{e(q.tag)}" size="10"></label>'
        f' <label>owner <select name="owner"><option value="">any</option>{owners}</select>'
        f'</label> <label><input type="checkbox" name="missed" value="1"{missed}> missed in '
        'the last hour</label> <button type="submit">find</button></form>'
    )


def page_body(viewer: Viewer, found: ListResult, members: list[str], now_ms: int) -> str:
    return (
        "<h1>Jobs</h1>"
        + search_form(found.query, members)
        + results(viewer, found, now_ms)
        + '<p class="muted">Type to search names (prefix matches first, then names holding the '
        "text); the list follows changes without reloading. Missed ticks are counted by the "
        "replica that owned them: see its console.</p>"
    )
