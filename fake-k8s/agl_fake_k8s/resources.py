"""The resources the fake API server serves (Jobs, Pods, Secrets): names, paths, delete and field-selector rules.

It owns the static facts about each resource type; behaviour (defaults, validation) lives elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["JOBS", "PODS", "RESOURCES", "SECRETS", "Resource", "by_path"]


@dataclass(frozen=True, slots=True)
class Resource:
    plural: str
    kind: str
    group: str
    version: str
    field_labels: frozenset[str]
    """Fields a fieldSelector may name besides metadata.name and metadata.namespace."""
    returns_deleted_object: bool
    """A delete that removes the object at once answers with the object (Pods) rather than a Status."""
    default_propagation: str
    """propagationPolicy when a delete names none (batch/v1 Jobs still orphan their pods)."""
    has_status: bool
    """Served with a /status subresource whose writes change only the status."""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified(self) -> str:
        """`jobs.batch`, `pods`: how NotFound/AlreadyExists/Conflict messages name the resource."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    @property
    def qualified_kind(self) -> str:
        """`Job.batch`, `Pod`: how Invalid messages name the kind."""
        return f"{self.kind}.{self.group}" if self.group else self.kind

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"


JOBS = Resource(
    plural="jobs",
    kind="Job",
    group="batch",
    version="v1",
    field_labels=frozenset({"status.successful"}),
    returns_deleted_object=False,
    default_propagation="Orphan",
    has_status=True,
)
PODS = Resource(
    plural="pods",
    kind="Pod",
    group="",
    version="v1",
    field_labels=frozenset(
        {
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        }
    ),
    returns_deleted_object=True,
    default_propagation="Background",
    has_status=True,
)
SECRETS = Resource(
    plural="secrets",
    kind="Secret",
    group="",
    version="v1",
    field_labels=frozenset({"type"}),
    returns_deleted_object=False,
    default_propagation="Background",
    has_status=False,
)
RESOURCES = (JOBS, PODS, SECRETS)
_BY_PATH = {(r.group, r.version, r.plural): r for r in RESOURCES}


def by_path(group: str, version: str, plural: str) -> Resource | None:
    return _BY_PATH.get((group, version, plural))
