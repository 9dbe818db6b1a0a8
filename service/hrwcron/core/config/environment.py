"""The ``HRWCRON_*`` overlay: every setting ``[section] key`` can be set by the variable
``HRWCRON_SECTION_KEY`` (plus a few short aliases), and a variable wins over the file.

Values are text and are parsed here (``"true"``, ``"90s"``, comma-separated lists); a problem
is reported under the variable's name, and a value that came from a variable says so in any
later message about its setting.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec

from hrwcron.core.config.schema import (
    DURATIONS,
    ENV_CONFIG_PATH,
    ENV_PREFIX,
    FAILPOINTS_ENV,
    SECRET_PATHS,
    SECTIONS,
)
from hrwcron.core.config.values import Bad, Collector, coerce, unknown

# Read by other parts of the process, not settings.
_ENV_NOT_SETTINGS = frozenset({ENV_CONFIG_PATH, FAILPOINTS_ENV})
_ENV_ALIASES: dict[str, tuple[str, str]] = {
    "HRWCRON_NATS_URL": ("nats", "servers"),
    "HRWCRON_NODE_ID": ("scheduler", "node_id"),
    "HRWCRON_LOG_LEVEL": ("telemetry", "log_level"),
    "HRWCRON_LOG_FORMAT": ("telemetry", "log_format"),
}


def _env_names() -> dict[str, tuple[str, str]]:
    names = {
        f"{ENV_PREFIX}{section.upper()}_{f.name.upper()}": (section, f.name)
        for section, struct in SECTIONS.items()
        for f in msgspec.structs.fields(struct)
    }
    names.update(_ENV_ALIASES)
    return names


_ENV_NAMES = _env_names()


def overlay_environment(
    values: dict[str, dict[str, Any]], env: Mapping[str, str], c: Collector
) -> None:
    """Set into ``values`` (section -> key -> value, as read from the file) every setting that
    an ``HRWCRON_*`` variable in ``env`` names; unknown or conflicting variables are problems."""
    chosen: dict[tuple[str, str], str] = {}
    for var in sorted(env):
        if not var.startswith(ENV_PREFIX) or var in _ENV_NOT_SETTINGS:
            continue
        target = _ENV_NAMES.get(var)
        if target is None:
            c.add(var, unknown(var, [*_ENV_NAMES, ENV_CONFIG_PATH], "variable"))
            continue
        section, key = target
        path = f"{section}.{key}"
        earlier = chosen.get(target)
        if earlier is not None:
            if env[earlier] != env[var]:
                c.add(var, f"conflicts with {earlier} (both set {path}); set only one")
            continue
        chosen[target] = var
        fields = msgspec.structs.fields(SECTIONS[section])
        typ = next(f.type for f in fields if f.name == key)
        try:
            value = coerce(
                env[var],
                typ,
                duration=key in DURATIONS[section],
                from_env=True,
                secret=path in SECRET_PATHS,
            )
        except Bad as exc:
            for suffix, message in exc.items:
                c.add(var, f"{message} (for {path}{suffix})")
            c.bad.add(path)
            continue
        values[section][key] = value
        c.origin[path] = var
        c.bad.discard(path)
