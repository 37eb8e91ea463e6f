"""The plan API (``stride.api.optimizer.v1.OptimizerService``) over :class:`Planning`.

Who may call (:data:`ACCESS`): users, for their own jobs (the owner is the admitted spec's
user, which admission took from the submitter's token); admins for every job.
"""

from __future__ import annotations

from typing import Any

import grpc

from stride.api.optimizer.v1 import optimizer_service_pb2 as pb
from stride.api.optimizer.v1 import optimizer_service_pb2_grpc as pb_grpc
from stride.events.v1 import metrics_pb2
from stride.optimizer.adapters.convert import STAGE_TO_PROTO
from stride.optimizer.domain.observations import InputQueue, Observations
from stride.optimizer.usecases import Planning
from stride.runtime import auth

Context = grpc.aio.ServicerContext[Any, Any]


SERVICE = pb.DESCRIPTOR.services_by_name["OptimizerService"].full_name
ACCESS = auth.rules(
    SERVICE,
    {
        method.name: auth.rule(users=True)
        for method in pb.DESCRIPTOR.services_by_name["OptimizerService"].methods
    },
)


def newest_throughput(view: Observations | None) -> float:
    """Samples/s of the job's newest step metrics (``stride top`` shows it and its ETA from
    it): the open window's rate, else the newest closed window's (a window just closed, or
    a decision due: reports wait for it), 0 before any was measured."""
    if view is None:
        return 0.0
    if view.window.steps:
        return view.window.rate
    return view.samples[-1].throughput if view.samples else 0.0


class OptimizerApi(pb_grpc.OptimizerServiceServicer):
    """gRPC servicer; errors are raised as domain errors and mapped by the server."""

    def __init__(self, planning: Planning) -> None:
        self.planning = planning

    async def _visible(self, job_id: str) -> str:
        """``job_id`` once the caller may see and act on it (its owner, or an admin)."""
        if not auth.current().admin:
            owner = await self.planning.job_owner(job_id)
            auth.require_owner(job_id, owner, "the optimizer knows no such admitted job")
        return job_id

    async def GetPlan(self, request: pb.GetPlanRequest, context: Context) -> pb.GetPlanResponse:
        plan, stage, view = await self.planning.newest_plan(await self._visible(request.job_id))
        return pb.GetPlanResponse(
            plan=plan,
            stage=STAGE_TO_PROTO[stage],
            windows=view.sample_count if view else 0,
            deciding=view is not None and view.pending >= 0,
            samples_per_second=newest_throughput(view),
            samples_consumed=view.consumed if view else 0,
            input_queue=_queue_to_proto(view.input_queue) if view and view.input_queue else None,
        )

    async def GetLoopSettings(
        self, request: pb.GetLoopSettingsRequest, context: Context
    ) -> pb.GetLoopSettingsResponse:
        planning = self.planning
        space = planning.space
        return pb.GetLoopSettingsResponse(
            tick_seconds=planning.window.tick_seconds,
            min_plan_interval_seconds=planning.min_plan_interval_seconds,
            worker_cpu=space.worker_cpu,
            ps_cpu=space.ps_cpu,
            workers=space.workers,
            ps=space.ps,
            job_cpu_limit=space.job_cpu_limit,
            enforce_shares=planning.enforce_shares,
        )

    async def ListPlans(
        self, request: pb.ListPlansRequest, context: Context
    ) -> pb.ListPlansResponse:
        return pb.ListPlansResponse(
            plans=await self.planning.plans(await self._visible(request.job_id))
        )

    async def ListOptimizationEvents(
        self, request: pb.ListOptimizationEventsRequest, context: Context
    ) -> pb.ListOptimizationEventsResponse:
        events = await self.planning.events(await self._visible(request.job_id))
        return pb.ListOptimizationEventsResponse(events=events)

    async def ScaleJob(self, request: pb.ScaleJobRequest, context: Context) -> pb.ScaleJobResponse:
        plan = await self.planning.scale(
            await self._visible(request.job_id),
            request.workers,
            request.ps,
            request.reason,
            request.data_workers if request.HasField("data_workers") else None,
        )
        return pb.ScaleJobResponse(plan=plan)

    async def GetPlanExplanation(
        self, request: pb.GetPlanExplanationRequest, context: Context
    ) -> pb.GetPlanExplanationResponse:
        rows = await self.planning.explanations(await self._visible(request.job_id))
        explanations = []
        for plan, why in rows:
            if why is None:
                explanations.append(pb.PlanExplanation(plan=plan, recorded=False))
                continue
            explanations.append(
                pb.PlanExplanation(
                    plan=plan,
                    algorithm=why.algorithm,
                    stage=why.stage,
                    root_cause=why.root_cause,
                    detail=why.detail,
                    samples_used=why.samples_used,
                    sample_count=why.sample_count,
                    fit_rmsle=why.fit_rmsle,
                    predicted_throughput=why.predicted_throughput,
                    predicted_current=why.predicted_current,
                    cost=why.cost,
                    bound=why.bound,
                    fallback=why.fallback,
                    recorded=True,
                )
            )
        return pb.GetPlanExplanationResponse(explanations=explanations)


def _queue_to_proto(queue: InputQueue) -> metrics_pb2.InputQueue:
    return metrics_pb2.InputQueue(
        data_workers=queue.data_workers,
        enqueue_rate=queue.enqueue_rate,
        dequeue_rate=queue.dequeue_rate,
        wait_share=queue.wait_share,
        queue_length=queue.queue_length,
    )
