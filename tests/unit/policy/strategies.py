"""Hypothesis strategies for policy values (builders for the property tests)."""

from __future__ import annotations

from hypothesis import strategies as st

from stride.policy.cold_start import JobFeatures
from stride.policy.plans import MAX_MEMORY_BYTES, Plan, PodOverride, Role, RoleResources

cpus = st.floats(min_value=0.001, max_value=512, allow_nan=False, allow_infinity=False)
memories = st.integers(min_value=1, max_value=MAX_MEMORY_BYTES)


@st.composite
def role_resources(draw: st.DrawFn, role: Role) -> RoleResources:
    count = draw(st.integers(min_value=0, max_value=64))
    indexes = (
        draw(st.lists(st.integers(0, max(count - 1, 0)), unique=True, max_size=3)) if count else []
    )
    overrides = tuple(PodOverride(index, draw(cpus), draw(memories)) for index in indexes)
    return RoleResources(role, count, draw(cpus), draw(memories), overrides)


@st.composite
def plans(draw: st.DrawFn) -> Plan:
    roles = draw(st.lists(st.sampled_from(list(Role)), unique=True, max_size=len(Role)))
    return Plan(
        roles=tuple(draw(role_resources(role)) for role in roles),
        reason=draw(st.text(min_size=1, max_size=30).filter(str.strip)),
        algorithm=draw(st.sampled_from(["cold-start-plan/1", "nsga2/3", "hot-ps/1"])),
    )


@st.composite
def job_features(draw: st.DrawFn) -> JobFeatures:
    by_steps = draw(st.booleans())
    return JobFeatures(
        model_name=draw(st.text(min_size=1, max_size=20)),
        record_count=draw(st.integers(1, 10**12)),
        batch_size=draw(st.integers(1, 10**6)),
        max_steps=draw(st.integers(1, 10**9)) if by_steps else 0,
        max_epochs=0 if by_steps else draw(st.integers(1, 1000)),
        family=draw(st.sampled_from(["", "dlrm", "wide-deep", "resnet"])),
        embedding_dim=draw(st.integers(0, 4096)),
    )
