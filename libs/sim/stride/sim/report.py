"""Reports of a simulation: one Markdown file with the run's context and a table per
environment, a PNG bar chart per metric, and ``results.json`` (the same context and
metrics, for scripts that compare runs).

A report is written to a temporary directory and moved into place only when complete, so
a failed or interrupted run never leaves a partial report that looks finished.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CONTEXT_FIELDS = frozenset({"policy", "seed", "synthetic"})
"""Result fields the report already states once (row label and run context)."""


@dataclass(frozen=True)
class RunContext:
    """What every table must state: where the numbers come from."""

    environment: str
    trace: str
    window: str
    cluster: str
    seed: int
    stride_version: str
    command: str
    notes: tuple[str, ...] = ()


def metric_rows(results: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """Columns and rows of a policy-by-metric table from result dataclasses.

    Every numeric or text field of the results becomes a column, in field order.
    """
    columns: list[str] = []
    for result in results.values():
        for field in dataclasses.fields(result):
            value = getattr(result, field.name)
            if (
                isinstance(value, int | float | str | None)
                and field.name not in columns
                and field.name not in CONTEXT_FIELDS
            ):
                columns.append(field.name)
    rows = []
    for policy, result in results.items():
        row = [policy]
        for column in columns:
            value = getattr(result, column, "")
            row.append(_format(value))
        rows.append(row)
    return columns, rows


def _json_value(value: object) -> object:
    """NaN and infinities have no JSON form: they become null, like a missing metric."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def results_document(context: RunContext, results: Mapping[str, Any]) -> dict[str, Any]:
    """``results.json``: the run context and every scalar metric per policy."""
    columns, _ = metric_rows(results)
    return {
        "context": dataclasses.asdict(context),
        "results": {
            policy: {column: _json_value(getattr(result, column, None)) for column in columns}
            for policy, result in results.items()
        },
    }


def _format(value: object) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if math.isnan(value):
            return "n/a"
        return f"{value:.4g}"
    return str(value)


def markdown(context: RunContext, results: Mapping[str, Any], plots: Sequence[str]) -> str:
    """The report text."""
    columns, rows = metric_rows(results)
    lines = [
        f"# stride sim: {context.environment}",
        "",
        f"- trace: {context.trace}",
        f"- window: {context.window}",
        f"- cluster: {context.cluster}",
        f"- seed: {context.seed}",
        f"- Stride version: {context.stride_version}",
        f"- reproduce: `{context.command}`",
        *[f"- note: {note}" for note in context.notes],
        "",
        "| policy | " + " | ".join(columns) + " |",
        "|---" * (len(columns) + 1) + "|",
        *["| " + " | ".join(row) + " |" for row in rows],
        "",
        f"_{context.environment} on {context.trace} ({context.window}), cluster "
        f"{context.cluster}, seed {context.seed}, Stride {context.stride_version}._",
        "",
        *[f"![{name}]({name})" for name in plots],
        "",
    ]
    return "\n".join(lines)


def _plot(path: Path, metric: str, results: Mapping[str, Any], context: RunContext) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    values = [float(getattr(results[name], metric) or 0.0) for name in names]
    figure, axes = plt.subplots(figsize=(max(4.0, 1.1 * len(names)), 3.2))
    axes.bar(names, values, color="#3b6ea8")
    axes.set_title(f"{metric} ({context.environment}, seed {context.seed})", fontsize=9)
    axes.tick_params(axis="x", labelrotation=30, labelsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _usage_plot(path: Path, results: Mapping[str, Any], capacity: int, context: RunContext) -> None:
    """GPUs allocated over time, one step line per policy (as a share of the cluster)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8.0, 3.6))
    origin = min(
        (result.gpu_usage[0][0] for result in results.values() if result.gpu_usage),
        default=0.0,
    )
    for name, result in results.items():
        if not result.gpu_usage:
            continue
        times = [(at - origin) / 3600.0 for at, _ in result.gpu_usage]
        shares = [gpus / capacity for _, gpus in result.gpu_usage]
        axes.step(times, shares, where="post", label=name, linewidth=0.8)
    axes.set_xlabel("hours since the first arrival")
    axes.set_ylabel("GPUs allocated / cluster")
    axes.set_ylim(0.0, 1.05)
    axes.set_title(f"GPU utilization over time ({context.environment})", fontsize=9)
    axes.legend(fontsize=7, ncols=3)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def write_report(
    out_dir: Path,
    context: RunContext,
    results: Mapping[str, Any],
    *,
    sections: Sequence[str] = (),
    capacity: int | None = None,
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write report.md and one PNG per numeric metric into ``out_dir`` atomically.

    ``sections``: more Markdown after the table. ``capacity``: the cluster's GPUs; with it,
    results that carry ``gpu_usage`` get a GPU-utilization-over-time plot. ``extra``: more
    top-level keys for ``results.json`` (e.g. the trace's physical bound)."""
    if not results:
        raise ValueError("results: no policy produced a result; nothing to report")
    for policy, result in results.items():
        if not dataclasses.is_dataclass(result) or isinstance(result, type):
            raise ValueError(f"results.{policy}: expected a result dataclass, got {result!r}")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        columns, _ = metric_rows(results)
        plots = []
        for metric in columns:
            values = [getattr(result, metric, None) for result in results.values()]
            numeric = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
            varies = len({v for v in values if v is not None}) > 1
            if numeric and varies and all(v is None or v in numeric for v in values):
                name = f"{metric}.png"
                _plot(staging / name, metric, results, context)
                plots.append(name)
        if capacity and any(getattr(result, "gpu_usage", ()) for result in results.values()):
            _usage_plot(staging / "gpu_utilization.png", results, capacity, context)
            plots.append("gpu_utilization.png")
        text = markdown(context, results, plots)
        if sections:
            text = text.rstrip("\n") + "\n\n" + "\n\n".join(sections) + "\n"
        (staging / "report.md").write_text(text)
        document = results_document(context, results)
        document.update(extra or {})
        (staging / "results.json").write_text(json.dumps(document, indent=1, allow_nan=False))
        if out_dir.exists():
            shutil.rmtree(out_dir)
        staging.replace(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out_dir / "report.md"
