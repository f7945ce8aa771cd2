"""Per-rollout keys derived from the admin key, so the gateway needs no key table (DESIGN.md §2).

A role key reads `agl-ROLE.ROLLOUT_ID.SIGNATURE`, where SIGNATURE is the HMAC-SHA256 of `"ROLE:" + ROLLOUT_ID`
under the admin key (`AGL_KEY`), base64url without padding. Keys are compared in constant time; nothing here logs.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from dataclasses import dataclass
from enum import StrEnum

__all__ = ["KeyRole", "Principal", "derive_key", "identify"]


class KeyRole(StrEnum):
    ADMIN = "admin"
    AGENT = "agent"
    GRADER = "grader"


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a valid key belongs to; `rollout_id` is None for the admin key."""

    role: KeyRole
    rollout_id: str | None = None


def _signature(secret: bytes, role: KeyRole, rollout_id: str) -> str:
    mac = hmac.new(secret, f"{role.value}:{rollout_id}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode()


def derive_key(admin_key: str, rollout_id: str, role: KeyRole = KeyRole.AGENT) -> str:
    """The agent (or grader) key of one rollout."""
    if role is KeyRole.ADMIN:
        raise ValueError("the admin key is AGL_KEY itself, not derived")
    return f"agl-{role.value}.{rollout_id}.{_signature(admin_key.encode(), role, rollout_id)}"


def identify(admin_key: str, presented: str) -> Principal | None:
    """The principal a presented key proves, or None for a key that is not valid."""
    try:
        raw = presented.encode()
    except UnicodeEncodeError:  # a header of undecodable bytes (aiohttp keeps them as surrogates) is no key
        return None
    if hmac.compare_digest(raw, admin_key.encode()):
        return Principal(KeyRole.ADMIN)
    head, _, rest = presented.partition(".")
    rollout_id, _, sig = rest.rpartition(".")
    if not head.startswith("agl-") or not rollout_id or not sig:
        return None
    try:
        role = KeyRole(head[4:])
    except ValueError:
        return None
    if role is KeyRole.ADMIN:
        return None
    if hmac.compare_digest(sig.encode(), _signature(admin_key.encode(), role, rollout_id).encode()):
        return Principal(role, rollout_id)
    return None
