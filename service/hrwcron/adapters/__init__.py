"""Adapters: the engine's ports on JetStream and in memory, and telemetry and HTTP at the edge."""
