"""Loading: a TOML file or text into a raw mapping, then into a checked Config.

The caller hands in the environment as a mapping (``os.environ`` at the process's edge, ``{}``
to ignore it), so loading reads no global state besides the file it is given.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from typing import Any

from hrwcron.core.config.schema import Config, ConfigFileError
from hrwcron.core.config.validate import build_config
from hrwcron.core.errors import Problem

_TOML_POSITION = re.compile(r"\s*\(at (line \d+, column \d+|end of document)\)$")


def parse_toml(text: str, source: str) -> dict[str, Any]:
    """The TOML document ``text`` as a mapping; raises ConfigFileError naming ``source`` and,
    when TOML tells it, the line and column."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        message = str(exc)
        found = _TOML_POSITION.search(message)
        where = found.group(1) if found else ""
        detail = message[: found.start()] if found else message
        raise ConfigFileError([Problem(where, f"invalid TOML: {detail}")], source) from None
    except RecursionError:
        problem = Problem("", "invalid TOML: arrays or tables nested too deeply")
        raise ConfigFileError([problem], source) from None


def read_text(path: str) -> str:
    """The UTF-8 text of the file at ``path``; raises ConfigFileError when it cannot be read."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigFileError([Problem("", f"cannot read: {exc.strerror}")], path) from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        problem = Problem("", f"not UTF-8 text (byte {exc.start})")
        raise ConfigFileError([problem], path) from None


def parse_config(
    text: str,
    source: str,
    env: Mapping[str, str],
    *,
    base_dir: str | None = None,
) -> Config:
    """A Config from TOML ``text`` overlaid with ``env``; raises ConfigFileError listing every
    problem. ``source`` names the text in messages; relative file paths in it are resolved
    against ``base_dir`` (the working directory when None)."""
    return build_config(parse_toml(text, source), source, env, base_dir)


def load_config(path: str | None, env: Mapping[str, str]) -> Config:
    """The Config in the TOML file at ``path`` (defaults when None), overlaid with ``env``."""
    if path is None:
        return build_config({}, "environment", env, None)
    text = read_text(path)
    return parse_config(text, path, env, base_dir=os.path.dirname(os.path.abspath(path)))
