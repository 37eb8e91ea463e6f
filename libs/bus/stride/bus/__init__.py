"""The NATS bus: JetStream streams for durable facts, core request/reply for executor work.

Payloads are protobuf messages from ``proto/`` only. Every publish carries ``Nats-Msg-Id``
(JetStream drops duplicates inside the stream's window) and the W3C trace context.
"""
