"""Loaders for the public traces in ``shared/traces`` (see its README for sources and licences).

Why it exists: every environment replays the same files, and a malformed row must fail with
the file, line and field named rather than deep inside a policy. Parsing is pure (text in,
records out); the ``load_*`` helpers only read files.

- ``itp-ef/clusterNN.csv`` and ``195job.csv``: ElasticFlow's ITP jobs
  (``job_id,submission_time,num_iteration,model_name,deadline,batch_size,num_gpu,duration``);
- ``itp-raw/clusterNN.csv``: the same ITP jobs with only their shape
  (``job_id,submission_time,duration,num_gpu``), for environments that need no model;
- ``philly-vc/philly_103959.csv``: ElasticFlow's Philly virtual cluster
  (``job_id,submit_time,real_iteration,model_name,ddl,batch_size,num_gpu,real_duration,...``);
- ``throughputs_A100|T4/<model>.csv``: measured curves, parsed by
  :mod:`stride.policy.elasticflow.curves` and made concave by its envelope;
- ``cluster_specs/nXgY.csv``: cluster shapes.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeVar

from stride.policy.elasticflow.curves import (
    ScalingCurve,
    concave_envelope,
    parse_throughput_table,
)
from stride.policy.errors import PolicyError
from stride.sim.engine import SimulationError

__all__ = [
    "ClusterSpec",
    "CurveLibrary",
    "RawTraceJob",
    "TraceJob",
    "TraceWindow",
    "load_cluster_spec",
    "load_curves",
    "load_deadline_trace",
    "load_raw_trace",
    "parse_cluster_spec",
    "parse_deadline_trace",
    "parse_raw_trace",
    "select_window",
]


class TraceError(SimulationError):
    """A trace file is malformed; the message starts with ``file:line field``."""

    def __init__(self, source: str, line: int, field: str, message: str) -> None:
        super().__init__(f"{source}:{line} {field}: {message}")
        self.source = source
        self.line = line
        self.field = field


@dataclass(frozen=True)
class TraceJob:
    """One deadline job as ElasticFlow's traces describe it (times in seconds).

    ``iterations`` is the work (``num_iteration``, or Philly's ``real_iteration``);
    ``duration`` the run time with ``num_gpu`` GPUs, used for lambda and by non-elastic
    baselines. ``deadline`` is None for a best-effort job.
    """

    job_id: str
    submission_time: float
    iterations: float
    model_name: str
    batch_size: int
    num_gpu: int
    duration: float
    deadline: float | None
    source: str = ""
    line: int = 0

    @property
    def tightness(self) -> float | None:
        """lambda = (deadline - submission) / duration (traces README); None if best effort."""
        if self.deadline is None:
            return None
        return (self.deadline - self.submission_time) / self.duration

    def rebased(self, origin: float) -> TraceJob:
        """The job with its times (submission and deadline) moved ``origin`` seconds earlier."""
        deadline = None if self.deadline is None else self.deadline - origin
        return replace(self, submission_time=self.submission_time - origin, deadline=deadline)


@dataclass(frozen=True)
class RawTraceJob:
    """One job's shape as ``itp-raw`` gives it: when it came, how long it ran on how many
    GPUs (seconds). No model, batch size or deadline."""

    job_id: str
    submission_time: float
    duration: float
    num_gpu: int
    source: str = ""
    line: int = 0

    def rebased(self, origin: float) -> RawTraceJob:
        """The job with its submission moved ``origin`` seconds earlier."""
        return replace(self, submission_time=self.submission_time - origin)


@dataclass(frozen=True)
class TraceWindow:
    """Which jobs of a trace to keep: a submission-time range, then the first N.

    ``start`` is inclusive and ``end`` exclusive; ``rebase`` shifts times so the first kept
    job arrives at 0 (deadlines shift with it).
    """

    start: float = -math.inf
    end: float = math.inf
    first_n: int | None = None
    rebase: bool = True


_ITP_FIELDS = (
    "job_id",
    "submission_time",
    "num_iteration",
    "model_name",
    "deadline",
    "batch_size",
    "num_gpu",
    "duration",
)
_RAW_FIELDS = ("job_id", "submission_time", "duration", "num_gpu")
_PHILLY_FIELDS = (
    "job_id",
    "submit_time",
    "real_iteration",
    "model_name",
    "ddl",
    "batch_size",
    "num_gpu",
    "real_duration",
)


def _unique_rows(
    reader: csv.DictReader[str], header: tuple[str, ...], source: str
) -> Iterator[tuple[int, dict[str, str], str]]:
    """(line, row, job id) of every row, raising TraceError for a row longer than the header
    or a missing or repeated job id."""
    seen: set[str] = set()
    for line, row in enumerate(reader, start=2):
        if None in row:
            raise TraceError(source, line, "row", f"has more cells than the header ({header})")
        job_id = (row.get("job_id") or "").strip()
        if not job_id or job_id in seen:
            raise TraceError(source, line, "job_id", f"must be unique and non-empty: {job_id!r}")
        seen.add(job_id)
        yield line, row, job_id


def _number(row: dict[str, str], field: str, source: str, line: int) -> float:
    text = (row.get(field) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise TraceError(source, line, field, f"is not a number: {text!r}") from None
    if not math.isfinite(value):
        raise TraceError(source, line, field, f"must be finite, got {text!r}")
    return value


def _whole(row: dict[str, str], field: str, source: str, line: int) -> int:
    value = _number(row, field, source, line)
    if value != int(value) or value <= 0:
        raise TraceError(source, line, field, f"must be a whole number > 0, got {row[field]!r}")
    return int(value)


def parse_deadline_trace(
    text: str, source: str = "trace", window: TraceWindow | None = None
) -> list[TraceJob]:
    """Jobs from an itp-ef or philly-vc CSV's text, sorted by submission time, then windowed.

    The format is recognised from the header. Rows are validated: positive iterations,
    duration and GPU count, deadline after submission. An empty window raises.
    """
    window = window or TraceWindow()
    reader = csv.DictReader(io.StringIO(text))
    header = tuple(reader.fieldnames or ())
    if all(field in header for field in _ITP_FIELDS):
        names = dict(
            submit="submission_time",
            iterations="num_iteration",
            deadline="deadline",
            duration="duration",
        )
    elif all(field in header for field in _PHILLY_FIELDS):
        names = dict(
            submit="submit_time",
            iterations="real_iteration",
            deadline="ddl",
            duration="real_duration",
        )
    else:
        raise TraceError(
            source, 1, "header", f"is neither itp-ef {_ITP_FIELDS} nor philly-vc {_PHILLY_FIELDS}"
        )
    jobs: list[TraceJob] = []
    for line, row, job_id in _unique_rows(reader, header, source):
        model = (row.get("model_name") or "").strip()
        if not model:
            raise TraceError(source, line, "model_name", "is empty")
        submit = _number(row, names["submit"], source, line)
        iterations = _number(row, names["iterations"], source, line)
        if iterations <= 0:
            raise TraceError(source, line, names["iterations"], f"must be > 0, got {iterations}")
        duration = _number(row, names["duration"], source, line)
        if duration <= 0:
            raise TraceError(source, line, names["duration"], f"must be > 0, got {duration}")
        deadline = _number(row, names["deadline"], source, line)
        if deadline <= submit:
            raise TraceError(
                source, line, names["deadline"], f"{deadline} is not after submission {submit}"
            )
        jobs.append(
            TraceJob(
                job_id=job_id,
                submission_time=submit,
                iterations=iterations,
                model_name=model,
                batch_size=_whole(row, "batch_size", source, line),
                num_gpu=_whole(row, "num_gpu", source, line),
                duration=duration,
                deadline=deadline,
                source=source,
                line=line,
            )
        )
    return select_window(jobs, window, source)


_Job = TypeVar("_Job", TraceJob, RawTraceJob)


def select_window(jobs: Sequence[_Job], window: TraceWindow, source: str = "trace") -> list[_Job]:
    """The jobs a window keeps, sorted by submission time (then file line); rebased so the
    first kept job arrives at 0 when ``window.rebase``. An empty window raises."""
    ordered = sorted(jobs, key=lambda job: (job.submission_time, job.line))
    kept = [job for job in ordered if window.start <= job.submission_time < window.end]
    if window.first_n is not None:
        if window.first_n <= 0:
            raise TraceError(source, 0, "window.first_n", f"must be > 0, got {window.first_n}")
        kept = kept[: window.first_n]
    if not kept:
        raise TraceError(
            source,
            0,
            "window",
            f"keeps no job of {len(ordered)} (start {window.start}, "
            f"end {window.end}, first_n {window.first_n})",
        )
    if window.rebase:
        origin = kept[0].submission_time
        kept = [job.rebased(origin) for job in kept]
    return kept


def load_deadline_trace(path: str | Path, window: TraceWindow | None = None) -> list[TraceJob]:
    """:func:`parse_deadline_trace` of a file."""
    file = Path(path)
    return parse_deadline_trace(file.read_text(encoding="utf-8"), str(file), window)


def parse_raw_trace(
    text: str, source: str = "trace", window: TraceWindow | None = None
) -> list[RawTraceJob]:
    """Job shapes from a CSV with the ``itp-raw`` columns (an ``itp-ef`` file has them too),
    sorted by submission time, then windowed as :func:`select_window` does.

    Rows are validated: a unique job id, a finite submission time, a duration > 0 and a
    whole number of GPUs > 0.
    """
    reader = csv.DictReader(io.StringIO(text))
    header = tuple(reader.fieldnames or ())
    missing = [field for field in _RAW_FIELDS if field not in header]
    if missing:
        raise TraceError(source, 1, missing[0], f"is missing from the header {header}")
    jobs: list[RawTraceJob] = []
    for line, row, job_id in _unique_rows(reader, header, source):
        duration = _number(row, "duration", source, line)
        if duration <= 0:
            raise TraceError(source, line, "duration", f"must be > 0, got {duration}")
        jobs.append(
            RawTraceJob(
                job_id=job_id,
                submission_time=_number(row, "submission_time", source, line),
                duration=duration,
                num_gpu=_whole(row, "num_gpu", source, line),
                source=source,
                line=line,
            )
        )
    return select_window(jobs, window or TraceWindow(), source)


def load_raw_trace(path: str | Path, window: TraceWindow | None = None) -> list[RawTraceJob]:
    """:func:`parse_raw_trace` of a file."""
    file = Path(path)
    return parse_raw_trace(file.read_text(encoding="utf-8"), str(file), window)


@dataclass(frozen=True)
class ClusterSpec:
    """A cluster shape from ``cluster_specs/nXgY.csv``."""

    num_switch: int
    num_node_p_switch: int
    num_gpu_p_node: int
    num_cpu_p_node: int
    mem_p_node: int
    source: str = ""

    @property
    def total_gpus(self) -> int:
        """GPUs in the whole cluster."""
        return self.num_switch * self.num_node_p_switch * self.num_gpu_p_node


_SPEC_FIELDS = ("num_switch", "num_node_p_switch", "num_gpu_p_node", "num_cpu_p_node", "mem_p_node")


def parse_cluster_spec(text: str, source: str = "cluster_spec") -> ClusterSpec:
    """The single data row of a cluster spec CSV, every field a whole number > 0."""
    reader = csv.DictReader(io.StringIO(text))
    header = tuple(reader.fieldnames or ())
    missing = [field for field in _SPEC_FIELDS if field not in header]
    if missing:
        raise TraceError(source, 1, missing[0], "is missing from the header")
    rows = list(reader)
    if len(rows) != 1:
        raise TraceError(source, 2, "row", f"expected exactly one data row, got {len(rows)}")
    row = rows[0]
    switches, nodes, gpus, cpus, memory = (_whole(row, name, source, 2) for name in _SPEC_FIELDS)
    return ClusterSpec(switches, nodes, gpus, cpus, memory, source)


def load_cluster_spec(path: str | Path) -> ClusterSpec:
    """:func:`parse_cluster_spec` of a file."""
    file = Path(path)
    return parse_cluster_spec(file.read_text(encoding="utf-8"), str(file))


class CurveLibrary:
    """Concave scaling curves (iterations/s by GPU count) by (model, global batch size).

    Built from a ``throughputs_<gpu>`` folder: each ``<model>.csv`` is parsed by
    :func:`~stride.policy.elasticflow.curves.parse_throughput_table` and every row made
    concave with :func:`~stride.policy.elasticflow.curves.concave_envelope` (power-of-two
    sizes up to the fastest point), as ElasticFlow's allocation requires.
    """

    def __init__(
        self,
        curves: dict[tuple[str, int], ScalingCurve],
        source: str = "",
        raw: dict[tuple[str, int], ScalingCurve] | None = None,
    ) -> None:
        """Wrap ready curves; ``source`` names the folder in errors. ``raw``: the tables as
        measured (every runnable column, past the peak too), when known; else the curves."""
        self.curves = dict(curves)
        self.source = source
        self.raw = dict(raw) if raw is not None else dict(curves)

    def curve(self, job: TraceJob) -> ScalingCurve:
        """The curve of a job's model and batch size; raises naming the job's line if absent."""
        return self._find(self.curves, job)

    def raw_curve(self, job: TraceJob) -> ScalingCurve:
        """The measured row as ElasticFlow's simulator reads it: every runnable column up to
        ``min(64, batch size)`` GPUs (its ``max_gpu``), past the throughput peak included."""
        row = self._find(self.raw, job)
        cap = min(64, job.batch_size)
        kept = [index for index, size in enumerate(row.sizes) if size <= cap] or [0]
        return ScalingCurve(
            tuple(row.sizes[index] for index in kept),
            tuple(row.throughputs[index] for index in kept),
        )

    def _find(self, table: dict[tuple[str, int], ScalingCurve], job: TraceJob) -> ScalingCurve:
        key = (job.model_name, job.batch_size)
        found = table.get(key)
        if found is None:
            known = sorted({model for model, _ in self.curves})
            if job.model_name not in known:
                raise TraceError(
                    job.source,
                    job.line,
                    "model_name",
                    f"unknown model {job.model_name!r} in {self.source or 'curves'} "
                    f"(known: {', '.join(known)})",
                )
            raise TraceError(
                job.source,
                job.line,
                "batch_size",
                f"no curve for {job.model_name} at batch size {job.batch_size} "
                f"in {self.source or 'curves'}",
            )
        return found


def load_curves(folder: str | Path, models: Sequence[str] | None = None) -> CurveLibrary:
    """A :class:`CurveLibrary` from every ``*.csv`` in ``folder`` (or only ``models``)."""
    directory = Path(folder)
    if not directory.is_dir():
        raise TraceError(str(directory), 0, "folder", "is not a directory")
    files = sorted(directory.glob("*.csv"))
    if models is not None:
        files = [file for file in files if file.stem in set(models)]
    curves: dict[tuple[str, int], ScalingCurve] = {}
    measured: dict[tuple[str, int], ScalingCurve] = {}
    for file in files:
        try:
            table = parse_throughput_table(file.read_text(encoding="utf-8"), str(file))
            for batch_size, raw in table.items():
                curves[(file.stem, batch_size)] = concave_envelope(raw)
                measured[(file.stem, batch_size)] = raw
        except PolicyError as error:
            raise TraceError(str(file), 0, "table", str(error)) from error
    if not curves:
        raise TraceError(str(directory), 0, "folder", "holds no throughput table")
    return CurveLibrary(curves, str(directory), measured)
