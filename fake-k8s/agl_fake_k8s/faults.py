"""Faults armed by tests and consumed by the API server: 429 bursts, 409 on updates, 410 on watches, 500 on creates.

Each fault is a counter the next matching requests use up, so a test says exactly how many requests fail.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Faults"]


@dataclass(slots=True)
class Faults:
    throttle_left: int = 0
    retry_after_s: int = 1
    conflicts_left: int = 0
    conflict_resource: str | None = None
    """Only updates of this resource ("jobs", "pods", "pods/status") get the 409; None: any."""
    watch_expiries_left: int = 0
    create_errors_left: int = 0
    """Creates answered 500 `InternalError` (an etcd timeout, a webhook down), as kube-apiserver answers them."""
    create_error_resource: str | None = None

    def take_throttle(self) -> int | None:
        """The Retry-After seconds when this request is to be shed with 429, else None."""
        if self.throttle_left <= 0:
            return None
        self.throttle_left -= 1
        return self.retry_after_s

    def take_conflict(self, resource: str) -> bool:
        if self.conflicts_left <= 0 or self.conflict_resource not in (None, resource):
            return False
        self.conflicts_left -= 1
        return True

    def take_watch_expiry(self) -> bool:
        if self.watch_expiries_left <= 0:
            return False
        self.watch_expiries_left -= 1
        return True

    def take_create_error(self, resource: str) -> bool:
        if self.create_errors_left <= 0 or self.create_error_resource not in (None, resource):
            return False
        self.create_errors_left -= 1
        return True
