"""Adapters that call in: the gRPC API and bus handlers, which drive the use cases."""
