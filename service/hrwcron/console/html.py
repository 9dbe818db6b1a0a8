"""What every console page shares: escaping, the layout around a page, forms that carry the
CSRF token, and the content-security policy.

Every value that reaches HTML goes through :func:`e`; job specs are written by operators and
API clients, so escaping is the first line of defence and the policy the second: scripts and
styles only from this replica's own static files, no inline script or style, no other origin
to talk to, and (where the browser supports it) no way for a script to write HTML from a
string except through the one named policy the console's script defines.
"""

from __future__ import annotations

import html
from urllib.parse import quote, urlencode

from hrwcron import __version__

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'; "
    "require-trusted-types-for 'script'; trusted-types hrwcron"
)


def e(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def job_url(name: str, **query: object) -> str:
    path = f"/jobs/{quote(name, safe='')}"
    args = {k: v for k, v in query.items() if v not in (None, "")}
    return f"{path}?{urlencode(args)}" if args else path


def until(ms: float) -> str:
    seconds = ms / 1000
    if abs(seconds) < 120:
        return f"in {seconds:.1f} s" if seconds >= 0 else f"{-seconds:.1f} s ago"
    minutes = seconds / 60
    if abs(minutes) < 120:
        return f"in {minutes:.0f} min" if minutes >= 0 else f"{-minutes:.0f} min ago"
    hours = minutes / 60
    if abs(hours) < 48:
        return f"in {hours:.1f} h" if hours >= 0 else f"{-hours:.1f} h ago"
    days = hours / 24
    return f"in {days:.0f} d" if days >= 0 else f"{-days:.0f} d ago"


class Viewer:
    """Who looks at a page: a signed-in user's name and CSRF token, or nobody."""

    __slots__ = ("csrf", "name", "node")

    def __init__(self, node: str, name: str = "", csrf: str = "") -> None:
        self.node = node
        self.name = name
        self.csrf = csrf

    @property
    def signed_in(self) -> bool:
        return bool(self.name)

    def __repr__(self) -> str:
        return f"Viewer({self.name!r})"


def form(viewer: Viewer, action: str, inner: str, *, css: str = "", confirm: str = "") -> str:
    """A POST form with the viewer's CSRF token; ``confirm`` asks again in the browser (the
    server asks as well where it matters)."""
    extra = f' data-confirm="{e(confirm)}"' if confirm else ""
    cls = f' class="{e(css)}"' if css else ""
    return (
        f'<form method="post" action="{e(action)}"{cls}{extra}>'
        f'<input type="hidden" name="csrf" value="{e(viewer.csrf)}">{inner}</form>'
    )


def button(label: str, name: str = "", value: str = "", css: str = "") -> str:
    attrs = f' name="{e(name)}" value="{e(value)}"' if name else ""
    cls = f' class="{e(css)}"' if css else ""
    return f'<button type="submit"{attrs}{cls}>{e(label)}</button>'


def user_bar(viewer: Viewer, can_sign_in: bool, back: str) -> str:
    if viewer.signed_in:
        return f'<span id="user">signed in as <b>{e(viewer.name)}</b></span> ' + form(
            viewer, "/logout", button("sign out"), css="inline"
        )
    if can_sign_in:
        return (
            '<span id="user" class="muted">read-only</span> '
            f'<a href="/login?{urlencode({"next": back})}">sign in to act</a>'
        )
    return '<span id="user" class="muted">read-only (no users configured)</span>'


def layout(
    viewer: Viewer,
    title: str,
    body: str,
    *,
    can_sign_in: bool,
    current: str,
    live: str = "",
    back: str = "/",
) -> str:
    """A whole page; ``live`` names what the script keeps current on it (see console.js)."""
    here = ' class="here"'
    nav = "".join(
        f'<a href="{href}"{here if current == key else ""}>{label}</a>'
        for key, href, label in (("fleet", "/", "Fleet"), ("jobs", "/jobs", "Jobs"))
    )
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{e(title)} · hrwcron {e(viewer.node)}</title>
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/static/console.css?v={e(__version__)}">
<script src="/static/console.js?v={e(__version__)}" defer></script>
</head>
<body data-live="{e(live)}">
<header><span class="brand">hrwcron</span> <span class="muted">replica</span>
<span id="node">{e(viewer.node)}</span> <nav>{nav}</nav>
<span class="right">{user_bar(viewer, can_sign_in, back)}
<span id="live-state" class="muted" aria-live="polite"></span></span></header>
<main>
{body}
</main>
</body></html>
"""


def message_page(viewer: Viewer, title: str, text: str, *, can_sign_in: bool, link: str) -> str:
    body = f'<h1>{e(title)}</h1><p id="message">{e(text)}</p><p><a href="{e(link)}">back</a></p>'
    return layout(viewer, title, body, can_sign_in=can_sign_in, current="", back=link)
