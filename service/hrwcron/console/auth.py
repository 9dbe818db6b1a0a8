"""Who a console request comes from, and whether it may read or act.

A person signs in with a name and password from ``http.users`` and gets a session: a random id
in an HttpOnly, SameSite=Strict cookie, kept in this replica's memory (bounded, expiring), so
a restart or another replica asks to sign in again. Behind a reverse proxy that authenticates,
``http.trusted_header`` names the user, believed only from ``http.trusted_proxies``.

Every form that acts carries a CSRF token tied to the session (or, for a proxy's user, to the
name), checked in constant time; a request from another origin is refused before that.
Passwords are checked off the event loop, and failed sign-ins of a name are rate-limited.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import hmac
import ipaddress
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from hrwcron.adapters.http import token_presented
from hrwcron.core.passwords import verify_password

# What a user's name may hold, whether typed at sign-in or named by a proxy: it goes into
# audit lines, so nothing that could start a line of its own or pass for another field.
USER_NAME = re.compile(r"[A-Za-z0-9_.@+-]{1,64}")
COOKIE = "hrwcron_session"
SESSION_S = 12 * 3600
MAX_SESSIONS = 1_000
# Failed sign-ins of one name within FAIL_WINDOW_S before it must wait out the window.
MAX_FAILURES = 5
FAIL_WINDOW_S = 60.0


@dataclass(frozen=True, slots=True)
class User:
    name: str
    csrf: str
    session: str = ""  # empty for a user named by the trusted header

    def __repr__(self) -> str:
        return f"User({self.name!r})"


class SignInRefused(Exception):
    pass


def parse_users(entries: Sequence[str]) -> dict[str, str]:
    """``NAME:HASH`` entries (checked by the config) as name -> hash."""
    users: dict[str, str] = {}
    for entry in entries:
        name, _, encoded = entry.partition(":")
        users[name] = encoded
    return users


class Auth:
    def __init__(
        self,
        *,
        users: dict[str, str],
        status_token: str | None = None,
        trusted_header: str = "",
        trusted_proxies: Sequence[str] = (),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._users = users
        self._token = status_token
        self._header = trusted_header
        self._proxies = frozenset(ipaddress.ip_address(a) for a in trusted_proxies)
        self._clock = clock
        self._key = secrets.token_bytes(32)
        self._sessions: collections.OrderedDict[str, tuple[str, str, float]] = (
            collections.OrderedDict()
        )
        self._failures: dict[str, collections.deque[float]] = {}

    def __repr__(self) -> str:
        return f"Auth(users={sorted(self._users)}, trusted_header={self._header!r})"

    @property
    def can_sign_in(self) -> bool:
        """Whether anyone could act: users are configured or a proxy names them."""
        return bool(self._users) or bool(self._header)

    @property
    def has_users(self) -> bool:
        return bool(self._users)

    # ------------------------------------------------------------------------- who

    def user(self, request: web.BaseRequest) -> User | None:
        if self._header and self._from_proxy(request):
            name = request.headers.get(self._header, "").strip()
            if USER_NAME.fullmatch(name):
                return User(name, self._csrf_for(f"header:{name}"))
        sid = request.cookies.get(COOKIE, "")
        found = self._sessions.get(sid) if sid else None
        if found is None:
            return None
        name, csrf, expires = found
        if self._clock() > expires:
            del self._sessions[sid]
            return None
        return User(name, csrf, sid)

    def _from_proxy(self, request: web.BaseRequest) -> bool:
        try:
            return ipaddress.ip_address(request.remote or "") in self._proxies
        except ValueError:
            return False

    def may_read(self, request: web.BaseRequest) -> bool:
        """Without a status token everyone may read; with one, whoever presents it or has
        signed in."""
        if self._token is None or token_presented(request, self._token):
            return True
        return self.user(request) is not None

    def csrf_ok(self, request: web.BaseRequest, user: User, given: str) -> bool:
        """The form's token is the user's, and the browser says the form is from this
        origin (or says nothing, as a non-browser client does)."""
        if not same_origin(request):
            return False
        return bool(given) and hmac.compare_digest(given, user.csrf)

    def _csrf_for(self, subject: str) -> str:
        return hmac.new(self._key, subject.encode(), hashlib.sha256).hexdigest()

    # ------------------------------------------------------------------ sign in / out

    async def sign_in(self, name: str, password: str) -> User:
        """A new session, or SignInRefused saying why (never which part was wrong)."""
        if not USER_NAME.fullmatch(name):
            raise SignInRefused("unknown user or wrong password")
        now = self._clock()
        failures = self._failures.setdefault(name, collections.deque())
        while failures and now - failures[0] > FAIL_WINDOW_S:
            failures.popleft()
        if len(failures) >= MAX_FAILURES:
            raise SignInRefused(
                f"too many failed sign-ins for this name; wait {FAIL_WINDOW_S:.0f} s"
            )
        encoded = self._users.get(name)
        # A name that is no user costs the same as a wrong password, so timing tells nothing.
        ok = (
            await asyncio.to_thread(verify_password, encoded or _DECOY, password)
            and encoded is not None
        )
        if not ok:
            failures.append(now)
            if len(self._failures) > MAX_SESSIONS:
                self._failures.pop(next(iter(self._failures)))
            raise SignInRefused("unknown user or wrong password")
        failures.clear()
        sid = secrets.token_urlsafe(32)
        csrf = secrets.token_urlsafe(32)
        self._sessions[sid] = (name, csrf, now + SESSION_S)
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        return User(name, csrf, sid)

    def sign_out(self, user: User) -> None:
        self._sessions.pop(user.session, None)


def same_origin(request: web.BaseRequest) -> bool:
    """Whether the browser says the request comes from a page of this site, or says nothing
    (a client that is no browser). Browsers say it in Sec-Fetch-Site; older ones only in
    Origin (which a page without referrers sends as "null"), whose host is compared: behind a
    proxy that ends TLS the page is https while this replica sees http."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None:
        return site in ("same-origin", "none")
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    return urlsplit(origin).netloc == request.host


# A valid hash of a random password, checked when the name is unknown.
_DECOY = "scrypt$16384$8$1$AAAAAAAAAAAAAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"
