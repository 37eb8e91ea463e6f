"""Adapters the use cases call out through: storage, the bus, and other services."""
