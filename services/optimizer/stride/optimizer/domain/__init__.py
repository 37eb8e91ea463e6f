"""The optimizer's pure domain: job administrators, their stages and the plans they publish.
No I/O imports; the algorithms come from the pure ``stride.policy`` library."""
