"""Configdb's pure domain: job features and the similarity used for warm start. No I/O imports."""
