"""``assert_eventually``: poll a condition instead of sleeping a guessed time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

T = TypeVar("T")


@overload
async def assert_eventually(
    probe: Callable[[], Awaitable[T]],
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
) -> T: ...


@overload
async def assert_eventually(
    probe: Callable[[], T],
    timeout: float = ...,
    interval: float = ...,
    message: str = ...,
) -> T: ...


async def assert_eventually(
    probe: Callable[[], object],
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str = "condition not met",
) -> object:
    """Call ``probe`` until it returns a truthy value without raising AssertionError.

    Returns that value. On timeout, fails with ``message`` and the last error or value.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            result = probe()
            if isinstance(result, Awaitable):
                result = await result
            if result:
                return result
            last = result
        except AssertionError as error:
            last = error
        if time.monotonic() >= deadline:
            raise AssertionError(f"{message} within {timeout:g}s (last: {last!r})")
        await asyncio.sleep(interval)
