"""The one validation of a job spec, shared by every place that reads one.

Admission refuses a spec at submit, the optimizer plans from it, configdb records it and
the CLI checks it before sending. If any of them judged a spec by rules of its own, a spec
one of them accepted could be refused by the next one after it was stored: a job admitted
but never planned, a message parked on a dead-letter stream. So all of them call
:func:`validate` here, and a refusal names the field by its dotted path
(``spec.model.embedding_dim``) with a problem a user can act on.

Pure on purpose (no protobuf, no I/O), like the rest of :mod:`stride.vocabulary`:
:class:`JobSpec` is a frozen view of ``stride.events.v1.JobSpec`` that
:meth:`JobSpec.from_message` reads from anything shaped like the generated message, so the
field-by-field copy exists once, here, and not in every service's adapter.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import Enum
from types import MappingProxyType
from typing import Literal, Protocol

from stride.vocabulary import InvalidWord, check_name, echo

__all__ = [
    "DATASET_FORMAT_BY_NUMBER",
    "INTEGER_RULES",
    "MAX_DEADLINE_AHEAD",
    "MAX_DEADLINE_YEARS",
    "MAX_EPOCHS",
    "MAX_LIST_RECORDS",
    "MAX_RECORD_COUNT",
    "MAX_REQUEST_ID_LENGTH",
    "MAX_SHARDS_PER_EPOCH",
    "MAX_SPEC_BYTES",
    "PRIORITY_BY_NUMBER",
    "RESOURCE_KIND_BY_NUMBER",
    "WELL_KNOWN_HYPERPARAMETERS",
    "DatasetFormat",
    "DatasetSpec",
    "Deadline",
    "JobSpec",
    "JobSpecMessage",
    "ModelReference",
    "NumberRange",
    "Priority",
    "ProfilePoint",
    "ResourceKind",
    "ScalingProfile",
    "Termination",
    "WholeNumber",
    "check_request_id",
    "check_whole_number",
    "deadline_too_far",
    "spec_too_large",
    "validate",
    "validate_values",
]

# --- Limits --------------------------------------------------------------------------------

MAX_SPEC_BYTES = 256 * 1024
"""Largest serialized job spec, in bytes. The spec rides whole inside the ``submitted`` and
``admitted`` events (and is stored by admission, the optimizer and configdb), and NATS
refuses any message over its ``max_payload`` of 1 MiB. A spec over that limit would be
stored and then never published, jamming the outbox behind it; a quarter of it leaves room
for the event around the spec, headers and a future field or two, and is still a hundred
times more than a real spec (names, a URI and a few dozen hyperparameters) needs."""

MAX_MODEL_NAME_LENGTH = 128
"""Model names are similarity features and show in every status line; as long as a job name."""
MAX_FAMILY_LENGTH = 64
"""A family is a short category ("dlrm", "resnet"), not a description."""
MAX_IMAGE_LENGTH = 512
"""A container image reference: Docker caps the repository path at 255 characters, a tag at
128 and a sha256 digest takes 71; a registry host and port fit in what is left."""
MAX_ENTRYPOINT_LENGTH = 256
"""``package.module:function``: a module path this long is already a typo."""
MAX_URI_LENGTH = 2048
"""The length most HTTP servers and object stores accept for a URL."""

# Dataset limits: one home for the spec's rules and the shard dispatcher's (which imports
# them), so a spec admission accepts is never refused when its trainer creates the dataset.
MAX_RECORD_COUNT = 10**12
"""A trillion records: over two hundred times Criteo's 4.4 billion click logs (the largest
public recommendation dataset). With :data:`MAX_EPOCHS` it keeps a job's total steps below
10**17, well inside a 64-bit integer, so no step count anywhere can overflow; the
dispatcher's stream offsets (``epoch * record_count``) stay inside one too."""
MAX_LIST_RECORDS = 2_000_000
"""Records of an index-list dataset (the dispatcher's ``SHARDING_KIND_INDEX_LIST``): each
epoch's record order is a seeded permutation the dispatcher holds in memory to slice shards
from (16 MB at this size). The trainer shards every job's dataset this way (shuffled), so a
job that trains (not ``simulated``) may have at most this many records."""
MAX_SHARDS_PER_EPOCH = 1_000_000
"""Shards one epoch of a dataset may be cut into, whatever the dispatcher's own setting
(which may only be lower). Shard ids are ``epoch * shards_per_epoch + index``, with ids from
``MAX_EPOCHS * MAX_SHARDS_PER_EPOCH`` up for split shards: stored ids depend on both, so
neither may ever change."""
MAX_BATCH_SIZE = 10_000_000
"""Ten million samples a step: a hundred times the largest batches published for
recommendation models (DLRM trains with tens of thousands); more is a unit mistake."""
MAX_STEPS = 10**11
"""A hundred billion steps: a thousand years at 3 steps a second, far past any deadline."""
MAX_EPOCHS = 100_000
"""Small datasets are trained for thousands of epochs, never for more than this. The shard
dispatcher's stored shard ids depend on it (:data:`MAX_SHARDS_PER_EPOCH`): never change it."""
MAX_EMBEDDING_DIM = 65_536
"""Recommendation models use 16 to 512 and the largest language models about 25,000; a
larger dimension is a typo, and it sizes parameter server memory, so it must not be one."""
MAX_PARAMETER_COUNT = 10**14
"""A hundred trillion dense parameters: fifty times the largest models trained today."""

MAX_HYPERPARAMETERS = 100
"""Entries in the hyperparameter map: trainers take a few dozen at most, and each entry is
passed to every pod of the job."""
MAX_HYPERPARAMETER_KEY_LENGTH = 64
"""Keys are identifiers (``learning_rate``, ``optimizer.beta1``), not text."""
MAX_HYPERPARAMETER_VALUE_LENGTH = 1024
"""A value is a number, a name or a short list; a longer one belongs in a file the trainer
reads, not in every event about the job."""
MAX_HYPERPARAMETER_BYTES = 16 * 1024
"""All keys and values together, in UTF-8 bytes: a hundred entries of realistic size fit
many times over, and the map stays a small part of :data:`MAX_SPEC_BYTES`."""

MAX_DEADLINE_YEARS = 10
"""A deadline at most this many years ahead. Training jobs finish within weeks; a deadline
decades out is a typo (``9999-12-31``) or a unit mistake (``+99999999d``), and refusing it
keeps every deadline computation (slack, EDF keys in float seconds) far from the year-9999
edge where datetimes overflow."""
MAX_DEADLINE_AHEAD = timedelta(days=365 * MAX_DEADLINE_YEARS + 3)
""":data:`MAX_DEADLINE_YEARS` as a duration (with the leap days of any ten years)."""

MAX_PROFILE_POINTS = 64
"""Points a declared scaling profile may have: ElasticFlow's tables have 7 (1..64 GPUs)."""
MAX_PROFILE_WORKERS = 4096
MAX_PROFILE_STEPS_PER_SECOND = 1e9
MAX_ROLE_CPU = 1024.0
"""Cores of one worker or PS in a declared profile (a large node has a few hundred)."""
MAX_ROLE_MEMORY_BYTES = 16 * 1024**4
"""Memory of one worker or PS in a declared profile: 16 TiB."""

MAX_REQUEST_ID_LENGTH = 200
"""A submission's idempotency key is stored in a 200-character column beside the job; the
CLI's derived keys take 45 (``spec-`` and 40 hex digits), a UUID 36."""

_TIMESTAMP_MIN_SECONDS = -62_135_596_800
"""0001-01-01T00:00:00Z, the earliest moment a ``google.protobuf.Timestamp`` may hold."""
_TIMESTAMP_MAX_SECONDS = 253_402_300_799
"""9999-12-31T23:59:59Z, the latest."""
_NANOS_PER_SECOND = 1_000_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

IMAGE_PATTERN = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
    r"(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?"
    r"(?:@[a-z0-9]+(?:[+._-][a-z0-9]+)*:[0-9a-fA-F]{32,})?$"
)
"""A container image reference as Docker and Kubernetes parse it: an optional registry
(``host[:port]/``), a lower-case repository path, an optional ``:tag`` and ``@digest``.
Kubernetes refuses to pull anything else, so admission refuses it first."""
ENTRYPOINT_PATTERN = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*$", re.ASCII)
"""``package.module:function``, the form the local backend imports and calls."""
URI_PATTERN = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")
"""A URI with a scheme (``file:///data``, ``s3://bucket/prefix``) and no spaces."""
HYPERPARAMETER_KEY_PATTERN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
"""A key is passed to the trainer as a flag or an environment variable name: an identifier,
possibly dotted (``optimizer.beta1``) or dashed."""
DECIMAL_PATTERN = re.compile(r"^[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?$")
"""A plain decimal number, as every trainer's language parses it (no ``nan``, ``inf`` or
``1_000``)."""


# --- Enums ---------------------------------------------------------------------------------


class Priority(Enum):
    """Scheduling priority of a job (``stride.events.v1.Priority``)."""

    LOW = "low"
    """Runs on spare capacity and is the first to be scaled in."""
    NORMAL = "normal"
    """The default."""
    HIGH = "high"
    """May preempt lower priorities down to their minimum workers."""


PRIORITY_BY_NUMBER: Mapping[int, Priority] = MappingProxyType(
    {0: Priority.NORMAL, 1: Priority.LOW, 2: Priority.NORMAL, 3: Priority.HIGH}
)
"""Wire numbers of ``stride.events.v1.Priority``; unspecified (0) means normal. Any other
number comes from a client built against another schema and is refused."""


class DatasetFormat(Enum):
    """Storage format of a dataset (``stride.events.v1.DatasetFormat``)."""

    TFRECORD = "tfrecord"
    """TFRecord files."""
    CSV = "csv"
    """CSV files."""
    PARQUET = "parquet"
    """Parquet files."""
    STREAM = "stream"
    """A streaming source read by partition and offset."""
    SYNTHETIC = "synthetic"
    """Samples the trainer generates itself."""


DATASET_FORMAT_BY_NUMBER: Mapping[int, DatasetFormat | None] = MappingProxyType(
    {
        0: None,
        1: DatasetFormat.TFRECORD,
        2: DatasetFormat.CSV,
        3: DatasetFormat.PARQUET,
        4: DatasetFormat.STREAM,
        5: DatasetFormat.SYNTHETIC,
    }
)
"""Wire numbers of ``stride.events.v1.DatasetFormat``; unspecified (0) means not given."""


# --- Rules for numbers ---------------------------------------------------------------------


@dataclass(frozen=True)
class WholeNumber:
    """The rule for one integer field of a spec."""

    maximum: int
    """The largest value accepted (see the ``MAX_*`` constant it comes from)."""
    required: bool
    """True: must be positive (proto3 cannot tell 0 from "not set"). False: 0 means not
    set, and negative values are refused."""
    meaning: str
    """Why it is required, or what 0 means; said in the error."""

    def check(self, field_path: str, value: int) -> None:
        """Raise :class:`InvalidWord` naming ``field_path`` unless ``value`` obeys the rule."""
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidWord(field_path, f"must be a whole number, got {echo(value)}")
        if self.required and value == 0:
            raise InvalidWord(field_path, f"is required: a positive whole number ({self.meaning})")
        if self.required and value < 0:
            raise InvalidWord(field_path, f"must be positive, got {echo(value)}")
        if value < 0:
            raise InvalidWord(
                field_path, f"must not be negative, got {echo(value)} ({self.meaning})"
            )
        if value > self.maximum:
            raise InvalidWord(field_path, f"must be at most {self.maximum:,}, got {echo(value)}")


INTEGER_RULES: Mapping[str, WholeNumber] = MappingProxyType(
    {
        "spec.model.embedding_dim": WholeNumber(
            MAX_EMBEDDING_DIM, False, "0 means the model has no embedding tables"
        ),
        "spec.model.parameter_count": WholeNumber(MAX_PARAMETER_COUNT, False, "0 means unknown"),
        "spec.dataset.record_count": WholeNumber(
            MAX_RECORD_COUNT, True, "sharding and deadlines depend on the dataset size"
        ),
        "spec.batch_size": WholeNumber(MAX_BATCH_SIZE, True, "the global batch size in samples"),
        "spec.termination.max_steps": WholeNumber(
            MAX_STEPS, False, "0 means the job stops after max_epochs"
        ),
        "spec.termination.max_epochs": WholeNumber(
            MAX_EPOCHS, False, "0 means the job stops after max_steps"
        ),
    }
)
"""Every integer field of a spec, by its dotted path, with its bounds."""


def check_whole_number(field_path: str, value: int) -> None:
    """Check ``value`` against the rule of the integer field ``field_path`` (a key of
    :data:`INTEGER_RULES`); the CLI calls it on numbers too large to fit the message."""
    INTEGER_RULES[field_path].check(field_path, value)


@dataclass(frozen=True)
class NumberRange:
    """The finite range a well-known numeric hyperparameter must lie in."""

    low: float
    high: float
    low_inclusive: bool
    high_inclusive: bool
    why: str
    """What the value is, said in the error."""

    def contains(self, value: float) -> bool:
        """True if ``value`` is finite and inside the range."""
        if not math.isfinite(value):
            return False
        above = value >= self.low if self.low_inclusive else value > self.low
        below = value <= self.high if self.high_inclusive else value < self.high
        return above and below

    def describe(self) -> str:
        """The range in interval notation, e.g. ``(0, 10]``."""
        left = "[" if self.low_inclusive else "("
        right = "]" if self.high_inclusive else ")"
        return f"{left}{self.low:g}, {self.high:g}{right}"


WELL_KNOWN_HYPERPARAMETERS: Mapping[str, NumberRange] = MappingProxyType(
    {
        "learning_rate": NumberRange(
            0.0, 10.0, False, True, "a step size; above 10 every optimizer diverges"
        ),
        "momentum": NumberRange(0.0, 1.0, True, False, "a decay factor below 1"),
        "weight_decay": NumberRange(0.0, 1.0, True, True, "a fraction of the weights"),
        "dropout": NumberRange(0.0, 1.0, True, False, "a probability below 1"),
    }
)
"""Hyperparameters every trainer reads the same way. Their values are checked at submit, so
a job does not start, take its resources and then fail on ``learning_rate: fast`` in its
first step. Others are passed through unchecked (beyond their size)."""


# --- The view ------------------------------------------------------------------------------


class _TimestampMessage(Protocol):
    @property
    def seconds(self) -> int: ...
    @property
    def nanos(self) -> int: ...


class _ModelMessage(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def image(self) -> str: ...
    @property
    def entrypoint(self) -> str: ...
    @property
    def family(self) -> str: ...
    @property
    def embedding_dim(self) -> int: ...
    @property
    def parameter_count(self) -> int: ...


class _DatasetMessage(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def uri(self) -> str: ...
    @property
    def record_count(self) -> int: ...
    @property
    def format(self) -> int: ...


class _TerminationMessage(Protocol):
    @property
    def max_steps(self) -> int: ...
    @property
    def max_epochs(self) -> int: ...


class _ProfilePointMessage(Protocol):
    @property
    def workers(self) -> int: ...
    @property
    def ps(self) -> int: ...
    @property
    def steps_per_second(self) -> float: ...


class _ProfileMessage(Protocol):
    @property
    def kind(self) -> int: ...
    @property
    def points(self) -> Sequence[_ProfilePointMessage]: ...
    @property
    def worker_cpu(self) -> float: ...
    @property
    def worker_memory_bytes(self) -> int: ...
    @property
    def ps_cpu(self) -> float: ...
    @property
    def ps_memory_bytes(self) -> int: ...


class JobSpecMessage(Protocol):
    """What :meth:`JobSpec.from_message` reads: the shape of ``stride.events.v1.JobSpec``."""

    @property
    def name(self) -> str: ...
    @property
    def user(self) -> str: ...
    @property
    def model(self) -> _ModelMessage: ...
    @property
    def dataset(self) -> _DatasetMessage: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def hyperparameters(self) -> Mapping[str, str]: ...
    @property
    def termination(self) -> _TerminationMessage: ...
    @property
    def deadline(self) -> _TimestampMessage: ...
    @property
    def soft_deadline(self) -> bool: ...
    @property
    def priority(self) -> int: ...
    @property
    def simulated(self) -> bool: ...
    @property
    def profile(self) -> _ProfileMessage: ...
    @property
    def resource_kind(self) -> int: ...
    def HasField(self, field_name: Literal["deadline", "profile"], /) -> bool:
        """Whether an optional message field is set."""
        ...

    def ByteSize(self) -> int:
        """The serialized size in bytes."""
        ...


@dataclass(frozen=True)
class ModelReference:
    """Where the training code comes from; exactly one of image or entrypoint is set."""

    name: str = ""
    image: str = ""
    entrypoint: str = ""
    family: str = ""
    embedding_dim: int = 0
    parameter_count: int = 0


@dataclass(frozen=True)
class DatasetSpec:
    """The data a job trains on."""

    name: str = ""
    uri: str = ""
    record_count: int = 0
    format: int = 0
    """The wire number; :data:`DATASET_FORMAT_BY_NUMBER` names it."""


@dataclass(frozen=True)
class Termination:
    """When training stops: exactly one of max_steps or max_epochs is positive."""

    max_steps: int = 0
    max_epochs: int = 0


@dataclass(frozen=True)
class Deadline:
    """A moment as the wire carries it (``google.protobuf.Timestamp``), not yet checked: a
    client may send nanos below zero or seconds past year 9999."""

    seconds: int
    nanos: int = 0

    def moment(self) -> datetime:
        """The aware UTC datetime; raises :class:`InvalidWord` if it is not a valid moment."""
        _check_deadline_range(self)
        return _EPOCH + timedelta(seconds=self.seconds, microseconds=self.nanos // 1000)

    @classmethod
    def of(cls, moment: datetime) -> Deadline:
        """The wire form of an aware datetime (a naive one is taken as UTC)."""
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC)
        since_epoch = moment - _EPOCH
        seconds = since_epoch // timedelta(seconds=1)
        micros = (since_epoch - timedelta(seconds=seconds)) // timedelta(microseconds=1)
        return cls(seconds, micros * 1000)


class ResourceKind(Enum):
    """What a job's sizes count when admission plans it (``stride.events.v1.ResourceKind``)."""

    CPU = "cpu"
    """Parameter servers and workers on CPU cores and memory (the default)."""
    GPU = "gpu"
    """GPUs, one per data-parallel worker (ElasticFlow's jobs)."""


RESOURCE_KIND_BY_NUMBER = {0: ResourceKind.CPU, 1: ResourceKind.GPU, 2: ResourceKind.CPU}
"""Wire numbers of ``stride.events.v1.ResourceKind``; unspecified (0) is a CPU job."""


@dataclass(frozen=True)
class ProfilePoint:
    """One measured point of a declared scaling profile."""

    workers: int
    ps: int
    steps_per_second: float


@dataclass(frozen=True)
class ScalingProfile:
    """How fast a job trains at some sizes, as the job declares it (not a resource request)."""

    kind: int = 0
    """The wire number; :data:`RESOURCE_KIND_BY_NUMBER` names it."""
    points: tuple[ProfilePoint, ...] = ()
    worker_cpu: float = 0.0
    worker_memory_bytes: int = 0
    ps_cpu: float = 0.0
    ps_memory_bytes: int = 0


@dataclass(frozen=True)
class JobSpec:
    """A frozen view of ``stride.events.v1.JobSpec``: the same fields under the same names,
    plus the serialized size (which only the message can measure)."""

    name: str = ""
    user: str = ""
    model: ModelReference = ModelReference()
    dataset: DatasetSpec = DatasetSpec()
    batch_size: int = 0
    hyperparameters: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    termination: Termination = Termination()
    deadline: Deadline | None = None
    soft_deadline: bool = False
    priority: int = 0
    """The wire number; :data:`PRIORITY_BY_NUMBER` names it."""
    simulated: bool = False
    """Played by ``stride loadgen``: planned as any job, and no pods start for it."""
    profile: ScalingProfile | None = None
    resource_kind: int = 0
    """The wire number; :data:`RESOURCE_KIND_BY_NUMBER` names it (a profile's kind wins)."""
    serialized_size: int = 0
    """The size of the message this view was read from, in bytes (0 if built by hand)."""

    @classmethod
    def from_message(cls, message: JobSpecMessage) -> JobSpec:
        """The view of a ``stride.events.v1.JobSpec`` message. Copies without judging:
        :func:`validate` judges."""
        model, dataset, termination = message.model, message.dataset, message.termination
        return cls(
            name=message.name,
            user=message.user,
            model=ModelReference(
                name=model.name,
                image=model.image,
                entrypoint=model.entrypoint,
                family=model.family,
                embedding_dim=model.embedding_dim,
                parameter_count=model.parameter_count,
            ),
            dataset=DatasetSpec(
                name=dataset.name,
                uri=dataset.uri,
                record_count=dataset.record_count,
                format=dataset.format,
            ),
            batch_size=message.batch_size,
            hyperparameters=MappingProxyType(dict(message.hyperparameters)),
            termination=Termination(
                max_steps=termination.max_steps, max_epochs=termination.max_epochs
            ),
            deadline=(
                Deadline(message.deadline.seconds, message.deadline.nanos)
                if message.HasField("deadline")
                else None
            ),
            soft_deadline=message.soft_deadline,
            priority=message.priority,
            simulated=message.simulated,
            profile=(
                ScalingProfile(
                    kind=message.profile.kind,
                    points=tuple(
                        ProfilePoint(point.workers, point.ps, point.steps_per_second)
                        for point in message.profile.points
                    ),
                    worker_cpu=message.profile.worker_cpu,
                    worker_memory_bytes=message.profile.worker_memory_bytes,
                    ps_cpu=message.profile.ps_cpu,
                    ps_memory_bytes=message.profile.ps_memory_bytes,
                )
                if message.HasField("profile")
                else None
            ),
            resource_kind=message.resource_kind,
            serialized_size=message.ByteSize(),
        )

    @property
    def priority_level(self) -> Priority:
        """The priority as a word (after :func:`validate`; unknown numbers raise)."""
        return _priority(self.priority)

    @property
    def dataset_format(self) -> DatasetFormat | None:
        """The dataset's format as a word, ``None`` if not given (after :func:`validate`)."""
        return _dataset_format(self.dataset.format)

    @property
    def kind(self) -> ResourceKind:
        """What the job's sizes count (after :func:`validate`): the profile's kind if it
        names one, else the spec's, else CPU."""
        if self.profile is not None and self.profile.kind:
            return _resource_kind(self.profile.kind, "spec.profile.kind")
        return _resource_kind(self.resource_kind, "spec.resource_kind")

    @property
    def deadline_at(self) -> datetime | None:
        """The deadline as an aware UTC datetime, ``None`` for best effort."""
        return None if self.deadline is None else self.deadline.moment()

    @property
    def total_steps(self) -> int:
        """Global steps the job runs: max_steps, or epochs times steps per epoch."""
        if self.termination.max_steps > 0:
            return self.termination.max_steps
        steps_per_epoch = -(-self.dataset.record_count // self.batch_size)
        return self.termination.max_epochs * steps_per_epoch


# --- Validation ----------------------------------------------------------------------------


def validate(spec: JobSpec, now: datetime | None) -> None:
    """Raise :class:`InvalidWord` naming the first bad field of a complete spec.

    ``now`` is the moment of submission: the deadline must lie after it and at most
    :data:`MAX_DEADLINE_AHEAD` beyond it, and a job that trains may have at most
    :data:`MAX_LIST_RECORDS` records. ``None`` skips those rules of submission, for a spec
    already admitted (its deadline may pass while it is planned); everything else is judged
    the same, so whatever admission accepts every later reader accepts too.
    """
    _check(spec, now, partial=False)


def validate_values(spec: JobSpec) -> None:
    """Raise :class:`InvalidWord` naming the first field whose *given* value is bad.

    For partial specs, such as a similarity query that names only a model and a batch size:
    missing fields and the rules between fields are not checked, but every value given
    obeys the same bounds as in :func:`validate`.
    """
    _check(spec, None, partial=True)


def spec_too_large(size: int) -> str:
    """The problem said of a spec of ``size`` bytes over :data:`MAX_SPEC_BYTES`."""
    return f"{size:,} bytes is over the {MAX_SPEC_BYTES:,}-byte limit for a job spec"


def deadline_too_far(written: str) -> str:
    """The problem said of a deadline further ahead than :data:`MAX_DEADLINE_AHEAD`."""
    return (
        f"{written} is more than {MAX_DEADLINE_YEARS} years ahead; "
        "a training deadline is days or weeks away"
    )


def check_request_id(value: str, field_path: str = "request_id") -> str:
    """``value`` if it can be a submission's idempotency key ("" means none); raises
    :class:`InvalidWord`. Control characters are refused: PostgreSQL cannot store a NUL, and
    a key is echoed in logs and errors."""
    _check_text(field_path, value, MAX_REQUEST_ID_LENGTH)
    return value


def _check(spec: JobSpec, now: datetime | None, *, partial: bool) -> None:
    if spec.serialized_size > MAX_SPEC_BYTES:
        raise InvalidWord("spec", spec_too_large(spec.serialized_size))
    _check_identity(spec, partial)
    _check_model(spec.model, partial)
    _check_dataset(spec.dataset, partial)
    if not partial and now is not None:
        # A rule of submission, like the deadline's: what admission accepted before it
        # existed (and every admitted spec a consumer reads) stays readable.
        _check_trained_dataset(spec)
    _whole_number("spec.batch_size", spec.batch_size, partial)
    if not partial and spec.batch_size > spec.dataset.record_count:
        raise InvalidWord(
            "spec.batch_size",
            f"{spec.batch_size:,} is larger than the dataset "
            f"({spec.dataset.record_count:,} records)",
        )
    _check_hyperparameters(spec.hyperparameters)
    _check_termination(spec.termination, partial)
    _check_deadline(spec, now, partial)
    _priority(spec.priority)
    _resource_kind(spec.resource_kind, "spec.resource_kind")
    if spec.profile is not None:
        _check_profile(spec.profile, spec.kind)


def _check_identity(spec: JobSpec, partial: bool) -> None:
    if spec.name or not partial:
        check_name(spec.name, "spec.name")
    if not spec.user and not partial:
        raise InvalidWord("spec.user", "is required (quotas are per user)")
    if spec.user:
        check_name(spec.user, "spec.user")


def _check_model(model: ModelReference, partial: bool) -> None:
    _check_text("spec.model.name", model.name, MAX_MODEL_NAME_LENGTH, required=not partial)
    if not partial and bool(model.image) == bool(model.entrypoint):
        raise InvalidWord(
            "spec.model",
            "set exactly one of image (Kubernetes) or entrypoint (local processes)",
        )
    if model.image:
        _check_text("spec.model.image", model.image, MAX_IMAGE_LENGTH)
        if not IMAGE_PATTERN.match(model.image):
            raise InvalidWord(
                "spec.model.image",
                f"{echo(model.image)} is not a container image reference "
                "(like registry.example.com/team/trainer:1.4, lower-case path)",
            )
    if model.entrypoint:
        _check_text("spec.model.entrypoint", model.entrypoint, MAX_ENTRYPOINT_LENGTH)
        if not ENTRYPOINT_PATTERN.match(model.entrypoint):
            raise InvalidWord(
                "spec.model.entrypoint",
                f"{echo(model.entrypoint)} must look like 'package.module:function'",
            )
    _check_text("spec.model.family", model.family, MAX_FAMILY_LENGTH)
    _whole_number("spec.model.embedding_dim", model.embedding_dim, partial)
    _whole_number("spec.model.parameter_count", model.parameter_count, partial)


def _check_dataset(dataset: DatasetSpec, partial: bool) -> None:
    if dataset.name or not partial:
        check_name(dataset.name, "spec.dataset.name")
    if dataset.uri:
        _check_text("spec.dataset.uri", dataset.uri, MAX_URI_LENGTH)
        if not URI_PATTERN.match(dataset.uri):
            raise InvalidWord(
                "spec.dataset.uri",
                f"{echo(dataset.uri)} is not a URI (like file:///data/x or s3://bucket/prefix)",
            )
    _whole_number("spec.dataset.record_count", dataset.record_count, partial)
    _dataset_format(dataset.format)


def _check_trained_dataset(spec: JobSpec) -> None:
    """A job that trains gets its dataset from the trainer as a shuffled index list (the
    dispatcher's ``SHARDING_KIND_INDEX_LIST``), which holds at most :data:`MAX_LIST_RECORDS`
    records: refused here, at submit, rather than by the dispatcher when the job starts."""
    records = spec.dataset.record_count
    if not spec.simulated and records > MAX_LIST_RECORDS:
        raise InvalidWord(
            "spec.dataset.record_count",
            f"{records:,} records is over the limit of {MAX_LIST_RECORDS:,} (MAX_LIST_RECORDS) "
            "for a job that trains: its trainer shards the dataset as a shuffled index list, "
            "which the shard dispatcher holds in memory",
        )


def _check_termination(termination: Termination, partial: bool) -> None:
    _whole_number("spec.termination.max_steps", termination.max_steps, partial)
    _whole_number("spec.termination.max_epochs", termination.max_epochs, partial)
    if not partial and (termination.max_steps > 0) == (termination.max_epochs > 0):
        raise InvalidWord("spec.termination", "set exactly one of max_steps or max_epochs")


def _check_hyperparameters(hyperparameters: Mapping[str, str]) -> None:
    path = "spec.hyperparameters"
    if len(hyperparameters) > MAX_HYPERPARAMETERS:
        raise InvalidWord(
            path, f"has {len(hyperparameters):,} entries; at most {MAX_HYPERPARAMETERS} are allowed"
        )
    # Sorted, so the first bad entry named is the same every time (map order is not).
    for key in sorted(hyperparameters):
        if not key:
            raise InvalidWord(path, "keys must not be empty")
        if len(key) > MAX_HYPERPARAMETER_KEY_LENGTH or not HYPERPARAMETER_KEY_PATTERN.match(key):
            raise InvalidWord(
                path,
                f"key {echo(key)} must be 1-{MAX_HYPERPARAMETER_KEY_LENGTH} letters, digits, "
                "'_', '.' or '-', starting with a letter or '_'",
            )
        value = hyperparameters[key]
        _check_text(f"{path}.{key}", value, MAX_HYPERPARAMETER_VALUE_LENGTH)
        known = WELL_KNOWN_HYPERPARAMETERS.get(key)
        if known is not None:
            _check_known_number(f"{path}.{key}", value, known)
    total = sum(len(k.encode()) + len(v.encode()) for k, v in hyperparameters.items())
    if total > MAX_HYPERPARAMETER_BYTES:
        raise InvalidWord(
            path,
            f"keys and values take {total:,} bytes; at most {MAX_HYPERPARAMETER_BYTES:,} "
            "(put large settings in a file the trainer reads)",
        )


def _check_known_number(field_path: str, value: str, known: NumberRange) -> None:
    stripped = value.strip()
    number = float(stripped) if DECIMAL_PATTERN.match(stripped) else math.nan
    if not known.contains(number):
        raise InvalidWord(
            field_path,
            f"{echo(value)} must be a number in {known.describe()} ({known.why})",
        )


def _check_deadline(spec: JobSpec, now: datetime | None, partial: bool) -> None:
    if spec.deadline is None:
        if spec.soft_deadline and not partial:
            raise InvalidWord(
                "spec.soft_deadline", "is set but there is no deadline; set spec.deadline too"
            )
        return
    moment = spec.deadline.moment()
    if now is None:
        return
    if moment <= now:
        raise InvalidWord(
            "spec.deadline",
            f"{_iso(moment)} is not in the future (now {_iso(now)})",
        )
    if moment - now > MAX_DEADLINE_AHEAD:
        raise InvalidWord("spec.deadline", deadline_too_far(_iso(moment)))


def _check_deadline_range(deadline: Deadline) -> None:
    if not 0 <= deadline.nanos < _NANOS_PER_SECOND:
        raise InvalidWord(
            "spec.deadline",
            f"nanos must be in 0..{_NANOS_PER_SECOND - 1:,}, got {echo(deadline.nanos)}",
        )
    if not _TIMESTAMP_MIN_SECONDS <= deadline.seconds <= _TIMESTAMP_MAX_SECONDS:
        raise InvalidWord(
            "spec.deadline",
            f"{echo(deadline.seconds)} seconds after 1970 is not a time in the years 1 to 9999",
        )


def _whole_number(field_path: str, value: int, partial: bool) -> None:
    rule = INTEGER_RULES[field_path]
    if partial and value == 0:
        return
    rule.check(field_path, value)


def _check_text(field_path: str, value: str, limit: int, *, required: bool = False) -> None:
    if not value.strip():
        if required:
            raise InvalidWord(field_path, "is required")
        if not value:
            return
    if len(value) > limit:
        raise InvalidWord(field_path, f"{echo(value)} is too long: at most {limit:,} characters")
    if any(unicodedata.category(character) in ("Cc", "Cs") for character in value):
        raise InvalidWord(field_path, f"{echo(value)} contains a control character")


def _resource_kind(number: int, field_path: str) -> ResourceKind:
    kind = RESOURCE_KIND_BY_NUMBER.get(number)
    if kind is None:
        raise InvalidWord(field_path, f"unknown resource kind {echo(number)}; use gpu or cpu")
    return kind


def _check_profile(profile: ScalingProfile, kind: ResourceKind) -> None:
    path = "spec.profile"
    _resource_kind(profile.kind, f"{path}.kind")
    if not profile.points:
        raise InvalidWord(f"{path}.points", "needs at least one point (workers, steps_per_second)")
    if len(profile.points) > MAX_PROFILE_POINTS:
        raise InvalidWord(
            f"{path}.points",
            f"has {len(profile.points):,} points; at most {MAX_PROFILE_POINTS} are allowed",
        )
    previous = 0
    for index, point in enumerate(profile.points):
        where = f"{path}.points[{index}]"
        if not 0 < point.workers <= MAX_PROFILE_WORKERS:
            raise InvalidWord(
                f"{where}.workers",
                f"must be in 1..{MAX_PROFILE_WORKERS}, got {echo(point.workers)}",
            )
        if point.workers <= previous:
            raise InvalidWord(
                f"{where}.workers",
                f"{point.workers} does not follow {previous}: list points in increasing workers",
            )
        previous = point.workers
        rate = point.steps_per_second
        if not (math.isfinite(rate) and 0 < rate <= MAX_PROFILE_STEPS_PER_SECOND):
            raise InvalidWord(
                f"{where}.steps_per_second",
                f"must be a positive number of steps per second, got {echo(rate)}",
            )
        if kind is ResourceKind.GPU and point.ps:
            raise InvalidWord(f"{where}.ps", "a GPU job has no parameter servers; leave it 0")
        if kind is ResourceKind.CPU and not 0 < point.ps <= MAX_PROFILE_WORKERS:
            raise InvalidWord(
                f"{where}.ps",
                f"a CPU job needs 1..{MAX_PROFILE_WORKERS} parameter servers, got {echo(point.ps)}",
            )
    roles = (
        ("worker_cpu", profile.worker_cpu, "worker_memory_bytes", profile.worker_memory_bytes),
        ("ps_cpu", profile.ps_cpu, "ps_memory_bytes", profile.ps_memory_bytes),
    )
    for cpu_name, cpu, memory_name, memory in roles:
        if kind is ResourceKind.GPU:
            if cpu or memory:
                raise InvalidWord(
                    f"{path}.{cpu_name if cpu else memory_name}",
                    "is for CPU jobs; a GPU job's profile counts GPUs only",
                )
            continue
        if not (math.isfinite(cpu) and 0 < cpu <= MAX_ROLE_CPU):
            raise InvalidWord(
                f"{path}.{cpu_name}", f"must be in (0, {MAX_ROLE_CPU:g}] cores, got {echo(cpu)}"
            )
        if not 0 < memory <= MAX_ROLE_MEMORY_BYTES:
            raise InvalidWord(
                f"{path}.{memory_name}",
                f"must be a positive number of bytes up to 16 TiB, got {echo(memory)}",
            )


def _priority(number: int) -> Priority:
    level = PRIORITY_BY_NUMBER.get(number)
    if level is None:
        choices = ", ".join(p.value for p in Priority)
        raise InvalidWord("spec.priority", f"unknown priority {echo(number)}; use one of {choices}")
    return level


def _dataset_format(number: int) -> DatasetFormat | None:
    if number not in DATASET_FORMAT_BY_NUMBER:
        choices = ", ".join(f.value for f in DatasetFormat)
        raise InvalidWord(
            "spec.dataset.format", f"unknown format {echo(number)}; use one of {choices}"
        )
    return DATASET_FORMAT_BY_NUMBER[number]


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
