"""Loading a job's entrypoint, ``package.module:function``, with one clear error."""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from typing import Any

ENTRYPOINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*\Z")


class EntrypointError(Exception):
    """The entrypoint cannot be loaded; the message names it and why."""


def load(entrypoint: str) -> Callable[..., Any]:
    """The function ``package.module:function`` names."""
    if not ENTRYPOINT.match(entrypoint or ""):
        raise EntrypointError(
            f"entrypoint {entrypoint!r} is not package.module:function "
            "(e.g. stride_examples.wide_deep:train)"
        )
    module_name, function_name = entrypoint.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # any import failure is the user's module's, reported whole
        raise EntrypointError(
            f"entrypoint {entrypoint}: module {module_name!r} does not import: "
            f"{type(error).__name__}: {error}"
        ) from None
    function = getattr(module, function_name, None)
    if not callable(function):
        raise EntrypointError(
            f"entrypoint {entrypoint}: module {module_name!r} has no function {function_name!r}"
        )
    found: Callable[..., Any] = function
    return found
