"""The controller's picture of the cluster: our Jobs by name and our pods by UID, indexed by rollout, fed by the
informers (watch events and relists) and by the Jobs the controller creates. No I/O; every change reports the
rollouts it concerns so only those are looked at again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from agl_lite.runner.k8s.views import JobView, PodView

__all__ = ["Cache"]


class Cache:
    def __init__(self) -> None:
        self.jobs: dict[str, JobView] = {}
        self.pods: dict[str, PodView] = {}
        self._pods_of: dict[str, set[str]] = {}

    # --- reads ---------------------------------------------------------------------------------------------------

    def job(self, name: str) -> JobView | None:
        return self.jobs.get(name)

    def pods_of(self, rollout_id: str) -> list[PodView]:
        """The rollout's pods in the cache (any Job of that name: callers filter by the Job they follow)."""
        return [self.pods[uid] for uid in self._pods_of.get(rollout_id, ()) if uid in self.pods]

    # --- writes: each returns the rollouts it touched ------------------------------------------------------------

    def put_job(self, obj: Mapping[str, Any]) -> set[str]:
        view = JobView.from_json(obj)
        if not view.name:
            return set()
        self.jobs[view.name] = view
        return {view.rollout_id} if view.rollout_id else set()

    def drop_job(self, obj: Mapping[str, Any]) -> set[str]:
        view = JobView.from_json(obj)
        old = self.jobs.pop(view.name, None)
        return {rid for rid in (view.rollout_id, old.rollout_id if old else None) if rid}

    def put_pod(self, obj: Mapping[str, Any]) -> set[str]:
        view = PodView.from_json(obj)
        if not view.uid:
            return set()
        self.pods[view.uid] = view
        if view.rollout_id:
            self._pods_of.setdefault(view.rollout_id, set()).add(view.uid)
            return {view.rollout_id}
        return set()

    def drop_pod(self, obj: Mapping[str, Any]) -> set[str]:
        view = PodView.from_json(obj)
        old = self.pods.pop(view.uid, None)
        rid = view.rollout_id or (old.rollout_id if old else None)
        if rid:
            uids = self._pods_of.get(rid)
            if uids is not None:
                uids.discard(view.uid)
                if not uids:
                    del self._pods_of[rid]
            return {rid}
        return set()

    def replace_jobs(self, items: Iterable[Mapping[str, Any]]) -> set[str]:
        """A relist: the Jobs are exactly `items` now; returns the rollouts of every Job added, changed or gone."""
        touched = {v.rollout_id for v in self.jobs.values() if v.rollout_id}
        self.jobs.clear()
        for obj in items:
            touched |= self.put_job(obj)
        return touched

    def replace_pods(self, items: Iterable[Mapping[str, Any]]) -> set[str]:
        touched = {v.rollout_id for v in self.pods.values() if v.rollout_id}
        self.pods.clear()
        self._pods_of.clear()
        for obj in items:
            touched |= self.put_pod(obj)
        return touched
