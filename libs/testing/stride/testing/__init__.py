"""Test support: real NATS servers, real databases, services run in-process or as processes.

Loaded as a pytest plugin (entry point ``stride``), so every test tree gets the fixtures.
"""
