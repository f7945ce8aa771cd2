"""Backends are resolved by name, lazily."""

from __future__ import annotations

import pytest

from agl_lite.errors import ConfigError
from agl_lite.runner.backends import backend_class
from agl_lite.runner.local import LocalBackend


def test_local_is_the_local_backend() -> None:
    assert backend_class("local") is LocalBackend


def test_an_unknown_backend_is_a_config_error_naming_the_choices() -> None:
    with pytest.raises(ConfigError, match="unknown runner backend 'docker': use one of local, k8s"):
        backend_class("docker")


def test_the_k8s_backend_owns_its_retries() -> None:
    pytest.importorskip("kubernetes")
    assert backend_class("k8s").owns_retries is True  # type: ignore[attr-defined]
