"""The agent's composition root: the trainer-facing API over the dispatcher, the checkpoint
cache and the bus.

The agent owns no storage (``needs_database = False``). Its readiness is its NATS
connection. The upstream channels reconnect by themselves, and their trouble reaches the
trainer as UNAVAILABLE naming the service, so they are not part of readiness: an agent
reporting NOT_SERVING because the dispatcher restarts would only get its pod restarted.
"""

from __future__ import annotations

from stride.agent.adapters.inbound.grpc_api import ACCESS, AgentApi, command_from_proto
from stride.agent.adapters.outbound.checkpoints import CheckpointClient
from stride.agent.adapters.outbound.control import AckPublisher, subscribe_commands
from stride.agent.adapters.outbound.shards import ShardClient
from stride.agent.adapters.outbound.steps import StepReporter
from stride.agent.settings import AgentSettings
from stride.agent.usecases import ControlChannel, PodAgent
from stride.api.agent.v1 import agent_service_pb2, agent_service_pb2_grpc
from stride.bus.permissions import agent_inbox_prefix
from stride.bus.signing import PodSigner
from stride.events.v1 import control_pb2
from stride.runtime import tls
from stride.runtime.errors import StartupError
from stride.runtime.lifecycle import Dependency, ServiceHost
from stride.runtime.tokens import TokenError, TokenSource, read_pod_key
from stride.wiring import connect_bus, create_host

SERVICE_NAME = agent_service_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name

CHANNEL_OPTIONS = [
    # Checkpoint chunks are up to a few MiB; allow headroom over gRPC's 4 MiB default.
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
]


def job_token(settings: AgentSettings) -> TokenSource | None:
    """The pod's job token, which the agent forwards upstream (the dispatcher and the cache
    take the job from it). Required over TLS; plain text sends none."""
    if settings.job_token_file is not None:
        return TokenSource(path=settings.job_token_file)
    if not tls.insecure():
        raise StartupError(
            "STRIDE_AGENT_JOB_TOKEN_FILE is not set: the pod watcher gives every pod a job "
            "token file; without it the dispatcher and the checkpoint cache refuse this pod"
        )
    return None


def pod_signer(settings: AgentSettings, token: TokenSource | None) -> PodSigner | None:
    """What signs the agent's events: the pod's own key beside its job token (see
    :mod:`stride.bus.signing`). Required over TLS; plain text signs nothing."""
    if token is None:
        return None
    if settings.job_key_file is None:
        raise StartupError(
            "STRIDE_AGENT_JOB_KEY_FILE is not set: the pod watcher gives every pod a key "
            "beside its job token; without it no consumer accepts what this pod publishes"
        )
    try:
        key = read_pod_key(settings.job_key_file)
    except TokenError as error:
        raise StartupError(f"STRIDE_AGENT_JOB_KEY_FILE: {error}") from None
    return PodSigner(key, token)


async def build(settings: AgentSettings) -> ServiceHost:
    """Connect everything and return a host ready to run."""
    host = create_host(settings, [SERVICE_NAME], ACCESS, only_job=settings.job_id)
    token = job_token(settings)
    # NATS gives the agent a user for its own job and pod, from its job token.
    bus = await connect_bus(
        settings,
        host,
        pod_signer(settings, token),
        token=token,
        inbox=agent_inbox_prefix(settings.job_id, settings.pod_name) if token else None,
    )
    dispatcher = tls.aio_channel(
        settings.dispatcher_address,
        server="dispatcher",
        identity="agent",
        options=CHANNEL_OPTIONS,
        token=token,
    )
    ckptcache = tls.aio_channel(
        settings.ckptcache_address,
        server="ckptcache",
        identity="agent",
        options=CHANNEL_OPTIONS,
        token=token,
    )

    async def always_ready() -> bool:
        return True

    shards = ShardClient(
        dispatcher,
        settings.dispatcher_address,
        settings.job_id,
        settings.pod_name,
        settings.upstream_timeout_seconds,
        token,
    )

    async def close_channels() -> None:
        shards.close()
        await dispatcher.close(None)
        await ckptcache.close(None)

    # Closed after the server stopped, so RPCs finishing in the grace period still forward.
    host.add_dependency(Dependency("upstream channels", always_ready, close_channels, False))
    control = ControlChannel(settings.pod_name)
    agent = PodAgent(
        settings.job_id,
        shards,
        CheckpointClient(ckptcache, settings.ckptcache_address, settings.job_id),
        StepReporter(bus, settings.job_id, settings.pod_name),
        control,
        AckPublisher(bus, settings.job_id, settings.pod_name),
    )

    async def receive(command: control_pb2.ControlCommand) -> None:
        control.deliver(command_from_proto(command), command.pod_name)

    unsubscribe = await subscribe_commands(bus, settings.job_id, receive)

    async def end_subscription() -> None:
        await host.stop.wait()
        await unsubscribe()

    host.add_root_task("control-commands", end_subscription)
    agent_service_pb2_grpc.add_AgentServiceServicer_to_server(AgentApi(agent), host.server.server)

    async def stop_watchers() -> None:
        # Ends every WatchControl stream with STOP as shutdown begins, so the server's
        # grace period is not spent waiting on streams that would never end by themselves.
        await host.stop.wait()
        control.close("the agent is shutting down")

    host.add_root_task("stop-watchers", stop_watchers)
    return host
