"""Test support: real NATS servers, real databases, services run in-process or as processes.

Loaded as a pytest plugin (entry point ``stride``), so every test tree gets the fixtures.
"""

from pathlib import Path as _Path

SHARED_TRACES = _Path(__file__).resolve().parents[5] / "shared" / "traces"
"""The public traces kept in ``shared/`` beside the checkout (``../shared/traces``)."""
