"""hrwcron: highly available cron for NATS."""

__version__ = "0.1.0"
