"""The ``StrideJob`` custom resource definition, generated from ``stride.events.v1.JobSpec``.

A StrideJob's ``spec`` is Stride's job spec, written as a spec file is (the proto's field
names; enums in short lower case; memory as quantities; a deadline as an RFC 3339 time or
``+<n>m/h/d`` from the object's creation). The schema is derived from the message, so the
API server refuses an unknown field (``workers:``, say) or a wrong type at ``kubectl apply``,
naming it; the pod watcher's parser (the CLI's, :mod:`stride.cli.jobspec`) and admission
then apply the remaining rules and put any refusal in the status. ``user`` and
``simulated`` are not in it: a StrideJob's user is its namespace
(:mod:`stride.vocabulary.tenants`).

``python -m stride.podwatcher.adapters.inbound.stridejob_crd`` prints it; the chart ships
that output (``deploy/helm/stride/crds/stridejobs.yaml``), and a test keeps the two equal.
"""

from __future__ import annotations

import sys
from typing import Any

import yaml
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from stride.events.v1 import job_pb2

GROUP = "stride.io"
VERSION = "v1alpha1"
PLURAL = "stridejobs"
KIND = "StrideJob"
HIDDEN = frozenset({"user", "simulated"})
"""Spec fields a StrideJob may not set: the namespace is the user; pods are real."""
_NUMBERS = (
    FieldDescriptor.TYPE_INT64,
    FieldDescriptor.TYPE_INT32,
    FieldDescriptor.TYPE_UINT64,
    FieldDescriptor.TYPE_UINT32,
)


def _enum_words(field: FieldDescriptor) -> list[str]:
    enum = field.enum_type
    assert enum is not None
    prefix = "_".join(part.upper() for part in _snake(enum.name).split("_")) + "_"
    words = []
    for value in enum.values:
        if value.number == 0:
            continue
        short = value.name.removeprefix(prefix)
        words.extend([short.lower(), value.name])
    return words


def _snake(name: str) -> str:
    out = []
    for index, char in enumerate(name):
        if char.isupper() and index:
            out.append("_")
        out.append(char.lower())
    return "".join(out)


def _field_schema(field: FieldDescriptor) -> dict[str, Any]:
    message = field.message_type
    if message is not None and message.GetOptions().map_entry:
        schema: dict[str, Any] = {
            "type": "object",
            "additionalProperties": {"x-kubernetes-preserve-unknown-fields": True},
        }
    elif message is not None and message.full_name == "google.protobuf.Timestamp":
        schema = {"type": "string", "description": "RFC 3339 time, or +<n>m/h/d from creation"}
    elif message is not None:
        schema = _message_schema(message)
    elif field.enum_type is not None:
        schema = {"type": "string", "enum": _enum_words(field)}
    elif field.type == FieldDescriptor.TYPE_BOOL:
        schema = {"type": "boolean"}
    elif field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        schema = {"type": "number"}
    elif field.type in _NUMBERS:
        schema = (
            {"x-kubernetes-int-or-string": True}
            if field.name.endswith("_memory_bytes")
            else {"type": "integer"}
        )
    else:
        schema = {"type": "string"}
    if field.is_repeated and not (message is not None and message.GetOptions().map_entry):
        return {"type": "array", "items": schema}
    return schema


def _message_schema(message: Descriptor, hidden: frozenset[str] = frozenset()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            field.name: _field_schema(field) for field in message.fields if field.name not in hidden
        },
    }


def _status_schema() -> dict[str, Any]:
    """What the pod watcher writes of a StrideJob (``stride.podwatcher.stridejobs``)."""
    return {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {
            "jobId": {"type": "string"},
            "phase": {"type": "string"},
            "message": {"type": "string"},
            "earliestDeadline": {"type": "string"},
            "guaranteedFinish": {"type": "string"},
            "planVersion": {"type": "integer"},
            "readyPods": {"type": "integer"},
            "progress": {"type": "string"},
            "percentDone": {"type": "integer"},
            "pods": {"type": "integer"},
            "observedGeneration": {"type": "integer"},
            "conditions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["type", "status"],
                    "properties": {
                        key: {"type": "string"}
                        for key in ("type", "status", "reason", "message", "lastTransitionTime")
                    },
                },
            },
        },
    }


COLUMNS = [
    ("Job", "string", ".status.jobId"),
    ("Phase", "string", ".status.phase"),
    ("Plan", "integer", ".status.planVersion"),
    ("Ready", "integer", ".status.readyPods"),
    ("Pods", "integer", ".status.pods"),
    ("Done%", "integer", ".status.percentDone"),
    ("Deadline", "string", ".spec.deadline"),
    ("Age", "date", ".metadata.creationTimestamp"),
]
"""``kubectl get stridejobs``: name, JSON type, where in the object."""


def definition() -> dict[str, Any]:
    """The CustomResourceDefinition."""
    spec = _message_schema(job_pb2.JobSpec.DESCRIPTOR, HIDDEN)
    spec["description"] = "Stride's job spec (no resources: Stride chooses them)."
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "listKind": f"{KIND}List",
                "plural": PLURAL,
                "singular": KIND.lower(),
                "shortNames": ["sj"],
                "categories": ["all"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": name, "type": kind, "jsonPath": path}
                        for name, kind, path in COLUMNS
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": _status_schema(),
                            },
                        }
                    },
                }
            ],
        },
    }


def render() -> str:
    header = (
        "# Generated by `python -m stride.podwatcher.adapters.inbound.stridejob_crd` from\n"
        "# stride.events.v1.JobSpec: edit the proto, not this file.\n"
    )
    return header + yaml.safe_dump(definition(), sort_keys=False, width=100)


if __name__ == "__main__":
    sys.stdout.write(render())
