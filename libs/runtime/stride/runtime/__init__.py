"""Process runtime shared by every Stride service: settings, lifecycle, gRPC server, health.

Keep this package's ``__init__`` empty of imports: domain code imports
``stride.runtime.errors`` and must not pull in gRPC by doing so.
"""
