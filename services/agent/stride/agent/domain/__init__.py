"""The agent's pure domain: who the pod is, what a step report is, and control commands.
No I/O imports."""
