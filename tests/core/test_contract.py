from __future__ import annotations

from agl_lite.core.contract import KeyRole, Principal, derive_key, identify

ADMIN = "admin-secret-0123456789"


def test_admin_key_identifies_admin() -> None:
    assert identify(ADMIN, ADMIN) == Principal(KeyRole.ADMIN)


def test_agent_key_identifies_its_rollout() -> None:
    key = derive_key(ADMIN, "ro-1")
    assert identify(ADMIN, key) == Principal(KeyRole.AGENT, "ro-1")


def test_grader_and_agent_keys_differ() -> None:
    assert derive_key(ADMIN, "ro-1", KeyRole.GRADER) != derive_key(ADMIN, "ro-1", KeyRole.AGENT)
    assert identify(ADMIN, derive_key(ADMIN, "ro-1", KeyRole.GRADER)) == Principal(KeyRole.GRADER, "ro-1")


def test_key_under_another_admin_key_is_invalid() -> None:
    assert identify(ADMIN, derive_key("another-secret-012345", "ro-1")) is None


def test_rollout_id_cannot_be_swapped_in_a_key() -> None:
    key = derive_key(ADMIN, "ro-1")
    assert identify(ADMIN, key.replace(".ro-1.", ".ro-2.")) is None


def test_role_cannot_be_swapped_in_a_key() -> None:
    key = derive_key(ADMIN, "ro-1", KeyRole.AGENT)
    assert identify(ADMIN, key.replace("agl-agent.", "agl-grader.")) is None


def test_garbage_is_invalid() -> None:
    for junk in ["", "agl-", "agl-agent..", "agl-admin.x.y", "Bearer x", "é"]:
        assert identify(ADMIN, junk) is None
