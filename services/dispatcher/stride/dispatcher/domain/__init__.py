"""The dispatcher's pure domain: dataset rules, shard cutting and the shard queue's state
machine. No I/O imports, so it is tested in milliseconds and reused by the simulator."""
