"""Turning one raw value (from TOML, or an environment variable's text) into the type of its
setting, and collecting every problem with its location instead of stopping at the first."""

from __future__ import annotations

import contextlib
import datetime
import difflib
import math
import re
import types
import typing
from collections.abc import Sequence
from typing import Any, Literal

from hrwcron.core.config.schema import redact_secrets, redact_url
from hrwcron.core.errors import Problem, ScheduleError
from hrwcron.core.schedule import parse_duration


class Bad(Exception):
    """Conversion failures of one value: (location suffix, message) pairs."""

    def __init__(self, *items: tuple[str, str]) -> None:
        super().__init__(items)
        self.items = items


def unusable(message: str, suffix: str = "") -> Bad:
    """One failure, located at the value's path plus ``suffix``."""
    return Bad((suffix, message))


_KINDS: tuple[tuple[type, str], ...] = (
    # bool before int: a TOML boolean is a Python int too.
    (bool, "a boolean"),
    (int, "an integer"),
    (float, "a number"),
    (str, "a string"),
    (list, "an array"),
    (dict, "a table"),
)


def kind(value: object) -> str:
    """How an error message names the type of ``value``: "an integer", "a table", ..."""
    named = (name for typ, name in _KINDS if isinstance(value, typ))
    return next(named, f"a {type(value).__name__}")


def _shown(value: object, secret: bool) -> str:
    if secret:
        return kind(value)
    if isinstance(value, str):
        return f"a string ({redact_secrets(redact_url(value))[:80]!r})"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"{kind(value)} ({value!r})"
    return kind(value)


def _duration(value: str) -> float:
    try:
        return float(parse_duration(value))
    except ScheduleError as exc:
        raise unusable("; ".join(p.message for p in exc.problems)) from None


_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


def coerce(value: Any, typ: Any, *, duration: bool, from_env: bool, secret: bool) -> Any:
    """``value`` as ``typ``. File values must already have the right TOML type; environment
    values are strings and are parsed."""
    origin = typing.get_origin(typ)
    args = typing.get_args(typ)
    if typ is Any:
        return value
    if origin is Literal:
        if value in args and isinstance(value, str):
            return value
        choices = ", ".join(repr(a) for a in args)
        raise unusable(f"must be one of {choices}, got {_shown(value, secret)}")
    if origin in (types.UnionType, typing.Union) and type(None) in args:
        if from_env and value == "":
            return None
        (inner,) = (a for a in args if a is not type(None))
        return coerce(value, inner, duration=duration, from_env=from_env, secret=secret)
    if origin is list:
        return _coerce_list(value, args[0], from_env=from_env, secret=secret)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if from_env and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        raise unusable(f"expected true or false, got {_shown(value, secret)}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_env:
            try:
                return int(value.strip())
            except ValueError:
                pass
        raise unusable(f"expected an integer, got {_shown(value, secret)}")
    if typ is float:
        return _coerce_float(value, duration=duration, from_env=from_env, secret=secret)
    if typ is str:
        if isinstance(value, str):
            return value
        if isinstance(value, datetime.date | datetime.time):
            # A TOML date or date-time written without quotes (start, end, exclude): the same
            # text in ISO form, so it is validated like a quoted one.
            return value.isoformat()
        raise unusable(f"expected a string, got {_shown(value, secret)}")
    raise TypeError(f"no conversion to {typ!r}")  # a new field type needs a branch above


def _coerce_list(value: Any, item: Any, *, from_env: bool, secret: bool) -> list[Any]:
    if from_env:
        value = [part.strip() for part in value.split(",") if part.strip()]
    if not isinstance(value, list):
        raise unusable(f"expected an array, got {_shown(value, secret)}")
    out: list[Any] = []
    failed: list[tuple[str, str]] = []
    for i, element in enumerate(value):
        try:
            out.append(coerce(element, item, duration=False, from_env=from_env, secret=secret))
        except Bad as exc:
            failed.extend((f"[{i}]{suffix}", message) for suffix, message in exc.items)
    if failed:
        raise Bad(*failed)
    return out


def _coerce_float(value: Any, *, duration: bool, from_env: bool, secret: bool) -> float:
    expected = "seconds or a duration like '90s' or '5m'" if duration else "a number"
    number: float | None = None
    if isinstance(value, int | float) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        if from_env:
            with contextlib.suppress(ValueError):
                number = float(value.strip())
        if number is None and duration:
            number = _duration(value)
    if number is None:
        raise unusable(f"expected {expected}, got {_shown(value, secret)}")
    if not math.isfinite(number):
        raise unusable("must be a finite number")
    return number


class Collector:
    """Problems found so far, the locations whose value could not be read (so checks that
    depend on them stay quiet instead of piling up follow-on errors) and where values came from
    when not from the file."""

    def __init__(self) -> None:
        self.problems: list[Problem] = []
        self.bad: set[str] = set()
        self.origin: dict[str, str] = {}

    def add(self, where: str, message: str) -> None:
        setter = self.origin.get(re.sub(r"\[\d+\].*$", "", where))
        if setter:
            message = f"{message} (set by {setter})"
        self.problems.append(Problem(where, message))

    def fail(self, where: str, exc: Bad) -> None:
        self.bad.add(where)
        for suffix, message in exc.items:
            self.add(where + suffix, message)

    def readable(self, *paths: str) -> bool:
        return not any(p in self.bad for p in paths)


def unknown(key: str, known: Sequence[str], what: str = "key") -> str:
    close = difflib.get_close_matches(key, known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else f"; known: {', '.join(sorted(known))}"
    return f"unknown {what}{hint}"
