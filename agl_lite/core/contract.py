"""The agent contract in one place (DESIGN.md §2): the per-rollout keys, the path prefix that attributes a call to
a rollout and an attempt, and the environment an attempt (and its grading step) starts with.

A role key reads `agl-ROLE.ROLLOUT_ID.SIGNATURE`, where SIGNATURE is the HMAC-SHA256 of `"ROLE:" + ROLLOUT_ID`
under the admin key (`AGL_KEY`), base64url without padding, so the gateway keeps no key table. Keys are compared
in constant time; nothing here logs. No I/O here.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Protocol

import orjson

__all__ = [
    "ATTEMPT_FROM_POD",
    "ATTRIBUTED_PREFIX",
    "TASK_INPUT_LIMIT",
    "KeyRole",
    "Principal",
    "RolloutView",
    "agent_env",
    "derive_key",
    "grader_env",
    "identify",
    "presented_key",
]

ATTRIBUTED_PREFIX = "/r/{rollout_id}/a/{attempt_id}"
"""Path prefix that attributes a call to a rollout and attempt: attribution lives in the path."""
ATTEMPT_FROM_POD = "$(AGL_ATTEMPT_ID)"
"""Given as the attempt id, asks for an env template that Kubernetes expands with the pod UID."""
TASK_INPUT_LIMIT = 64 * 1024
"""Above this many bytes of JSON, the input is not put in the env (env vars cap at 128 KiB); the agent GETs
AGL_TASK_URL instead."""


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


class RolloutView(Protocol):
    """What the env is built from: a stored rollout (`store.records.Rollout`)."""

    @property
    def id(self) -> str: ...
    @property
    def mode(self) -> str: ...
    @property
    def input(self) -> Any: ...


def agent_env(public_url: str, admin_key: str, rollout: RolloutView, attempt_id: str) -> dict[str, str]:
    """The environment an attempt starts with; `attempt_id` may be `$(AGL_ATTEMPT_ID)`."""
    base = f"{public_url}/r/{rollout.id}/a/{attempt_id}"
    key = derive_key(admin_key, rollout.id, KeyRole.AGENT)
    env = {
        "OPENAI_BASE_URL": f"{base}/v1",
        "OPENAI_API_KEY": key,
        "ANTHROPIC_BASE_URL": base,
        "ANTHROPIC_API_KEY": key,
        "AGL_EVENT_URL": f"{base}/events",
        "AGL_ROLLOUT_ID": rollout.id,
        "AGL_ATTEMPT_ID": attempt_id,
        "AGL_MODE": rollout.mode,
    }
    task = orjson.dumps(rollout.input).decode()
    if len(task) <= TASK_INPUT_LIMIT:
        env["AGL_TASK_INPUT"] = task
    else:
        env["AGL_TASK_URL"] = f"{base}/task"
    return env


def grader_env(public_url: str, admin_key: str, rollout: RolloutView, attempt_id: str) -> dict[str, str]:
    """The grading step's environment: the grader key and its own URLs; never given to the agent."""
    base = f"{public_url}/r/{rollout.id}/a/{attempt_id}"
    return {
        "AGL_GRADER_KEY": derive_key(admin_key, rollout.id, KeyRole.GRADER),
        "AGL_GRADE_URL": f"{base}/grade",
        "AGL_ROLLOUT_ID": rollout.id,
        "AGL_ATTEMPT_ID": attempt_id,
        "AGL_MODE": rollout.mode,
    }


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key the client sent: `Authorization: Bearer KEY` or `x-api-key: KEY`."""
    auth = headers.get("Authorization")
    if auth is not None:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("x-api-key")
    return key.strip() if key and key.strip() else None
