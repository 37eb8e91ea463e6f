"""``python -m stride.trainer``: a pod's trainer process.

A PS or worker runs TensorFlow's server for its task until SIGTERM. The chief loads the
job's entrypoint (``model.entrypoint`` of the spec) and calls it with a
:class:`~stride.trainer.loop.TrainingContext`; so does a data worker, whose context serves
ready mini-batches instead of training (:mod:`stride.trainer.dataworker`). A bad setting or
an entrypoint that does not load ends the process with code 2 and one line on stderr naming
the problem.
"""

from __future__ import annotations

import signal
import sys

from pydantic import ValidationError

from stride.trainer.entrypoint import EntrypointError, load
from stride.trainer.settings import TrainerSettings

USAGE_ERROR = 2


def serve(settings: TrainerSettings) -> int:
    """Run a PS or worker server until SIGTERM (or SIGINT)."""
    # Blocked before TensorFlow starts its threads, so they inherit the mask and only
    # sigwait below sees the signal.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    import tensorflow as tf

    server = tf.distribute.Server(
        tf.train.ClusterSpec(settings.cluster),
        job_name=settings.role,
        task_index=settings.index,
        protocol="grpc",
        start=True,
    )
    print(f"{settings.role} {settings.index} serving at {server.target}", flush=True)
    received = signal.sigwait({signal.SIGTERM, signal.SIGINT})
    print(
        f"{settings.role} {settings.index} stopping on {signal.Signals(received).name}", flush=True
    )
    return 0


def main() -> int:
    """Run the role this pod was given; returns the exit code."""
    try:
        settings = TrainerSettings()  # type: ignore[call-arg]
    except ValidationError as error:
        problems = "; ".join(
            f"STRIDE_TRAINER_{'_'.join(str(p) for p in e['loc']).upper()}: {e['msg']}"
            for e in error.errors()
        )
        print(f"error: {problems}", file=sys.stderr)
        return USAGE_ERROR
    if settings.role in ("ps", "worker"):
        return serve(settings)
    from stride.trainer.loop import ReExec, TrainingContext, re_exec

    context = TrainingContext(settings)
    try:
        entry = load(context.spec.model.entrypoint)
    except EntrypointError as error:
        print(f"error: {error}", file=sys.stderr)
        return USAGE_ERROR
    try:
        entry(context)
    except ReExec as again:
        print(f'{{"event": "re-exec", "why": "{again}"}}', flush=True)
        context.agent.close()
        re_exec(again.changes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
