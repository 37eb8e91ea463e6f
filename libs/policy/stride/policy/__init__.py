"""Stride's pure resource policies: plans, the algorithms that make them, and their registry.

Pure on purpose: nothing here imports gRPC, NATS, SQLAlchemy or the generated protos, so the
same code runs inside the optimizer, in the executor pool and in ``stride sim``. Services
convert to and from their wire formats in their own adapters.
"""
