"""Scaling curves: throughput (iterations per time unit) of one job by device count.

ElasticFlow's admission control and allocation rest on one assumption: "The scaling curves
for DL training jobs are concave" (sec. 3.2, 4.1), so the per-device throughput falls as
devices are added and one device is the most efficient. This module holds the curve type
that checks that assumption where it is used, a loader for the measured ElasticFlow tables
(``throughputs_A100/*.csv``, ``throughputs_T4/*.csv``) and the step that makes a measured,
noisy table usable.

A curve is a list of *allowed sizes* (device counts a job may run on) with a throughput for
each. Between allowed sizes a job runs on the largest allowed size that fits: devices beyond
it are not taken (:meth:`ScalingCurve.usable`), so a job never claims a throughput that was
not measured. Concavity is that of the piecewise-linear function through ``(0, 0)`` and the
allowed points (slopes non-increasing), together with monotonicity (non-decreasing).

The resource is not fixed to GPUs: "devices" are whatever unit the caller counts (GPUs, CPU
shares); :func:`curve_from_function` builds a curve from any throughput provider.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from stride.policy.errors import PolicyError

CONCAVITY_TOLERANCE = 1e-9
"""Relative slack in the slope comparison, so a linear curve measured in floating point
(slopes equal up to rounding) still counts as concave."""


class InvalidCurve(PolicyError):
    """A scaling curve is malformed: empty, unsorted sizes, negative or NaN throughput."""


class NonConcaveCurve(InvalidCurve):
    """A curve is not concave (or not monotone) where the algorithm assumes it is."""


@dataclass(frozen=True)
class ScalingCurve:
    """Throughput of one job at each allowed device count (ElasticFlow sec. 3.2, Fig. 2a).

    ``sizes`` are strictly increasing positive device counts; ``throughputs[k]`` is the
    throughput on ``sizes[k]`` devices, finite and >= 0. The throughput on zero devices is 0.
    """

    sizes: tuple[int, ...]
    throughputs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.sizes:
            raise InvalidCurve("curve.sizes", "must not be empty")
        if len(self.sizes) != len(self.throughputs):
            raise InvalidCurve(
                "curve.throughputs",
                f"has {len(self.throughputs)} values for {len(self.sizes)} sizes",
            )
        previous = 0
        for index, size in enumerate(self.sizes):
            if isinstance(size, bool) or not isinstance(size, int) or size <= previous:
                raise InvalidCurve(
                    f"curve.sizes[{index}]",
                    f"must be a whole number > {previous} (sizes strictly increase), got {size!r}",
                )
            previous = size
        for index, value in enumerate(self.throughputs):
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value < 0
            ):
                raise InvalidCurve(
                    f"curve.throughputs[{index}]", f"must be finite and >= 0, got {value!r}"
                )

    @property
    def max_size(self) -> int:
        """The largest allowed device count."""
        return self.sizes[-1]

    def usable(self, devices: int) -> int:
        """The largest allowed size <= ``devices`` (0 if none): what a job actually takes."""
        cache = self._usable
        found = cache.get(devices)
        if found is None:
            found = 0
            for size in self.sizes:
                if size > devices:
                    break
                found = size
            cache[devices] = found
        return found

    def throughput(self, devices: int) -> float:
        """Throughput when ``devices`` are offered: that of :meth:`usable` devices."""
        cache = self._throughput
        found = cache.get(devices)
        if found is None:
            found = 0.0
            for size, value in zip(self.sizes, self.throughputs, strict=True):
                if size > devices:
                    break
                found = value
            cache[devices] = found
        return found

    # Memo tables (the curve is immutable; schedulers ask these in every round).
    @functools.cached_property
    def _usable(self) -> dict[int, int]:
        return {}

    @functools.cached_property
    def _throughput(self) -> dict[int, float]:
        return {}

    def next_faster(self, devices: int) -> tuple[int, float] | None:
        """The next allowed size above ``devices`` that is strictly faster, with its gain.

        Memoised per curve: greedy allocation asks it for every job in every round.
        """
        cache = self._next_faster
        if devices not in cache:
            current = self.throughput(devices)
            found: tuple[int, float] | None = None
            for size, value in zip(self.sizes, self.throughputs, strict=True):
                if size > devices and value > current:
                    found = (size, value - current)
                    break
            cache[devices] = found
        return cache[devices]

    @functools.cached_property
    def _next_faster(self) -> dict[int, tuple[int, float] | None]:
        return {}

    @functools.cached_property
    def device_seconds_per_iteration(self) -> float:
        """Devices x seconds per iteration at the smallest size with throughput (0 if none)."""
        for size, value in zip(self.sizes, self.throughputs, strict=True):
            if value > 0:
                return size / value
        return 0.0

    def table(self, capacity: int) -> tuple[list[int], list[float]]:
        """``usable(d)`` and ``throughput(d)`` for every d in 0..capacity (lookup tables)."""
        usable = [0] * (capacity + 1)
        values = [0.0] * (capacity + 1)
        index = -1
        for devices in range(1, capacity + 1):
            while index + 1 < len(self.sizes) and self.sizes[index + 1] <= devices:
                index += 1
            if index >= 0:
                usable[devices] = self.sizes[index]
                values[devices] = self.throughputs[index]
        return usable, values

    def concavity_violation(self) -> tuple[int, str] | None:
        """The first point that breaks monotone concavity, with why; None if there is none."""
        return self._violation

    @functools.cached_property
    def _violation(self) -> tuple[int, str] | None:
        # Cached: the curve is immutable and allocation checks it on every call.
        previous_size, previous_value = 0, 0.0
        previous_slope = math.inf
        for index, (size, value) in enumerate(zip(self.sizes, self.throughputs, strict=True)):
            if value < previous_value:
                return index, (
                    f"throughput {value!r} on {size} devices is below {previous_value!r} on "
                    f"{previous_size} (curve must not decrease)"
                )
            slope = (value - previous_value) / (size - previous_size)
            if slope > previous_slope * (1 + CONCAVITY_TOLERANCE) + CONCAVITY_TOLERANCE:
                return index, (
                    f"slope {slope:.6g} up to {size} devices exceeds the previous slope "
                    f"{previous_slope:.6g} (curve must be concave)"
                )
            previous_size, previous_value, previous_slope = size, value, slope
        return None

    def is_concave(self) -> bool:
        """Whether the curve is non-decreasing and concave through the origin."""
        return self.concavity_violation() is None

    def require_concave(self, field: str = "curve") -> None:
        """Raise :class:`NonConcaveCurve` naming the first bad point, if there is one."""
        violation = self.concavity_violation()
        if violation is not None:
            index, problem = violation
            raise NonConcaveCurve(f"{field}.throughputs[{index}]", problem)


def concave_envelope(curve: ScalingCurve, *, powers_of_two_only: bool = True) -> ScalingCurve:
    """A usable curve from a measured one: the vertices of its upper concave hull.

    Measured tables are noisy and often stop scaling (``throughputs_T4/ncf.csv`` is fastest
    on 4 GPUs; ``yolov3.csv`` collapses at 8). The paper assumes concavity but does not say
    how it treats such tables; Stride's choice, tested in ``test_elasticflow_curves.py``:

    1. keep only power-of-two sizes if ``powers_of_two_only`` (buddy placement, sec. 4.3,
       allows nothing else);
    2. cut the curve after its highest throughput and drop any size that is not strictly
       faster than a smaller one (adding devices must make the job finish earlier, the
       condition of Algorithm 2 line 9);
    3. keep only the vertices of the upper concave hull of ``(0, 0)`` and the rest.

    Every kept point is a real measurement, so the result never claims a throughput that
    was not observed; a dropped size simply becomes one the job is never run on.
    """
    points = [
        (size, value)
        for size, value in zip(curve.sizes, curve.throughputs, strict=True)
        if not powers_of_two_only or size & (size - 1) == 0
    ]
    if not points:
        raise InvalidCurve("curve.sizes", "has no power-of-two size")
    peak = max(range(len(points)), key=lambda index: (points[index][1], -index))
    increasing: list[tuple[int, float]] = []
    for size, value in points[: peak + 1]:
        if value > (increasing[-1][1] if increasing else 0.0):
            increasing.append((size, value))
    if not increasing:
        raise InvalidCurve("curve.throughputs", "no size has a positive throughput")
    hull: list[tuple[float, float]] = [(0.0, 0.0)]
    for size, value in increasing:
        # Pop the last vertex while the slope rises through it (it lies under the chord to
        # the new point), by the same test as concavity_violation: collinear points stay.
        while len(hull) >= 2:
            (x0, y0), (x1, y1) = hull[-2], hull[-1]
            before = (y1 - y0) / (x1 - x0)
            after = (value - y1) / (size - x1)
            if after > before * (1 + CONCAVITY_TOLERANCE) + CONCAVITY_TOLERANCE:
                hull.pop()
            else:
                break
        hull.append((float(size), value))
    kept = hull[1:]
    return ScalingCurve(
        sizes=tuple(int(size) for size, _ in kept), throughputs=tuple(v for _, v in kept)
    )


def parse_throughput_table(text: str, source: str = "table") -> dict[int, ScalingCurve]:
    """Raw curves by global batch size from an ElasticFlow throughput CSV's text.

    The format is ``global_batch_size,1,2,4,...`` then one row per batch size with
    iterations per second per device count. Empty, ``nan`` and non-positive cells mean the
    configuration cannot run and are left out; a row with no runnable cell is left out.
    The curves are as measured (possibly not concave): pass them to
    :func:`concave_envelope` before admission or allocation. Malformed text raises
    :class:`InvalidCurve` naming ``source`` and the line.
    """
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        raise InvalidCurve(source, "is empty")
    header = [cell.strip() for cell in lines[0].split(",")]
    if header[0] != "global_batch_size" or len(header) < 2:
        raise InvalidCurve(f"{source}:1", "header must be 'global_batch_size,<sizes>...'")
    sizes: list[int] = []
    for column, cell in enumerate(header[1:], start=1):
        if not cell.isdigit() or int(cell) <= 0 or (sizes and int(cell) <= sizes[-1]):
            raise InvalidCurve(
                f"{source}:1[{column}]", f"must be an increasing device count, got {cell!r}"
            )
        sizes.append(int(cell))
    curves: dict[int, ScalingCurve] = {}
    for line_number, line in enumerate(lines[1:], start=2):
        cells = [cell.strip() for cell in line.split(",")]
        if len(cells) > len(header):
            raise InvalidCurve(
                f"{source}:{line_number}", f"has {len(cells)} cells, header has {len(header)}"
            )
        cells += [""] * (len(header) - len(cells))
        if not cells[0].isdigit() or int(cells[0]) <= 0:
            raise InvalidCurve(
                f"{source}:{line_number}[0]",
                f"batch size must be a positive integer, got {cells[0]!r}",
            )
        batch_size = int(cells[0])
        if batch_size in curves:
            raise InvalidCurve(f"{source}:{line_number}[0]", f"batch size {batch_size} repeats")
        row_sizes: list[int] = []
        row_values: list[float] = []
        for column, cell in enumerate(cells[1:], start=1):
            if cell == "":
                continue
            try:
                value = float(cell)
            except ValueError:
                raise InvalidCurve(
                    f"{source}:{line_number}[{column}]", f"is not a number: {cell!r}"
                ) from None
            if math.isnan(value) or value <= 0:
                continue
            if math.isinf(value):
                raise InvalidCurve(f"{source}:{line_number}[{column}]", "must be finite")
            row_sizes.append(sizes[column - 1])
            row_values.append(value)
        if row_sizes:
            curves[batch_size] = ScalingCurve(tuple(row_sizes), tuple(row_values))
    return curves


def load_throughput_table(path: str | Path) -> dict[int, ScalingCurve]:
    """:func:`parse_throughput_table` of a file (a thin helper; the parser stays pure)."""
    file = Path(path)
    return parse_throughput_table(file.read_text(encoding="utf-8"), source=str(file))


def curve_from_function(
    provider: Callable[[int], float], sizes: Sequence[int], *, require_concave: bool = True
) -> ScalingCurve:
    """A curve sampled from any throughput provider at ``sizes`` (e.g. CPU shares).

    ``provider`` may be another module's throughput model; the result is validated like a
    measured curve and, unless ``require_concave`` is False, must be monotone and concave.
    """
    values: list[float] = []
    for index, size in enumerate(sizes):
        value = provider(size)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidCurve(f"curve.throughputs[{index}]", f"provider returned {value!r}")
        values.append(float(value))
    curve = ScalingCurve(tuple(sizes), tuple(values))
    if require_concave:
        curve.require_concave()
    return curve
