"""The checkpoint cache's pure domain: what a valid checkpoint is, its checksum, and the tier
seam (memory first, then durable storage). No I/O imports."""
