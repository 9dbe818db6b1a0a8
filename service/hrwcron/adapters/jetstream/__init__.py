"""JetStream adapters: connection, provisioning and the engine's ports on a real NATS server."""
