"""Test-wide settings. Fixtures come from the ``stride.testing`` pytest plugin."""

from __future__ import annotations

import os

from hypothesis import settings

# Under CI, property tests replay the same examples every run (a red build is never a roll
# of the dice) and have no per-example deadline (a loaded 2-core runner is slow). Developers
# get fresh random examples each run, which is how new counterexamples are found.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")
