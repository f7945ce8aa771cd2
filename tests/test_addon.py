"""`agl_lite.addon`, the one module addon authors import: a sorted `__all__`, every name in it real and public."""

from __future__ import annotations

import agl_lite.addon as addon


def test_all_is_sorted_and_names_only_what_the_module_has() -> None:
    assert addon.__all__ == sorted(addon.__all__, key=lambda n: (not n.isupper(), n))
    assert all(hasattr(addon, name) for name in addon.__all__)


def test_every_public_name_of_the_module_is_in_all() -> None:
    public = {n for n in vars(addon) if not n.startswith("_") and n != "annotations"}
    assert public == set(addon.__all__)


def test_an_addon_needs_nothing_else_for_the_hooks_it_implements() -> None:
    """The names an addon's hooks take or return: the flow, config and options, the load context and its
    services, the store and its records."""
    for name in ("Flow", "GatewayConfig", "option", "LoadContext", "ServiceKey", "STORE", "Store", "LLMCall"):
        assert name in addon.__all__
    assert set(addon.all_hooks) >= {"request", "response_headers", "response_end", "error", "flow_done"}
