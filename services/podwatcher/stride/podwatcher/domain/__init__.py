"""Podwatcher's pure domain: resource plans, their validation and ordering, pods and nodes.

No I/O imports.
"""
