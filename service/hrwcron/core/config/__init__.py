"""Service configuration: a TOML file, overlaid with ``HRWCRON_*`` environment variables.

Loading never stops at the first mistake: every problem is collected with a dotted location
(``scheduler.member_ttl``, ``jobs[2].schedule``, ``nats.servers[0]``) so an operator fixes a
file in one round trip. Secrets (passwords, tokens, credentials inside server URLs) never reach
``repr()``, ``str()`` or an error message.

The steps live apart: :mod:`.load` (file or text to a raw mapping), :mod:`.environment` (the
``HRWCRON_*`` overlay), :mod:`.validate` and :mod:`.checks` (raw values to checked records,
with :mod:`.values` converting one value), and :mod:`.settings` (the records themselves).
"""

from hrwcron.core.config.checks import config_warnings
from hrwcron.core.config.load import load_config, parse_config
from hrwcron.core.config.schema import (
    DEFAULT_SERVER,
    ENV_CONFIG_PATH,
    ENV_PREFIX,
    FAILPOINTS_ENV,
    MASK,
    NATS_DEFAULT_MAX_PAYLOAD,
    NODE_ID_RULE,
    URL_SCHEMES,
    Config,
    ConfigFileError,
    HttpConfig,
    LogFormat,
    LogLevel,
    NatsConfig,
    SchedulerConfig,
    Storage,
    TelemetryConfig,
    default_node_id,
    node_id_problem,
    redact_secrets,
    redact_url,
)

__all__ = [
    "DEFAULT_SERVER",
    "ENV_CONFIG_PATH",
    "ENV_PREFIX",
    "FAILPOINTS_ENV",
    "MASK",
    "NATS_DEFAULT_MAX_PAYLOAD",
    "NODE_ID_RULE",
    "URL_SCHEMES",
    "Config",
    "ConfigFileError",
    "HttpConfig",
    "LogFormat",
    "LogLevel",
    "NatsConfig",
    "SchedulerConfig",
    "Storage",
    "TelemetryConfig",
    "config_warnings",
    "default_node_id",
    "load_config",
    "node_id_problem",
    "parse_config",
    "redact_secrets",
    "redact_url",
]
