"""Runnable examples of the checkpoint client (``python -m stride.ckptclient.examples.<name>``)."""
