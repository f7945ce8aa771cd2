"""URL and key from the arguments, else AGL_URL / AGL_KEY; a URL that is not http(s) is a config error."""

from __future__ import annotations

import pytest

from agl_lite.client.settings import DEFAULT_URL, ClientSettings
from agl_lite.errors import ConfigError


def test_arguments_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_URL", "http://env:1")
    monkeypatch.setenv("AGL_KEY", "env-key")
    settings = ClientSettings.resolve("http://arg:2/", "arg-key")
    assert (settings.url, settings.key) == ("http://arg:2", "arg-key")


def test_the_environment_fills_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGL_URL", "https://gw.example")
    monkeypatch.setenv("AGL_KEY", "env-key")
    assert ClientSettings.resolve() == ClientSettings("https://gw.example", "env-key")


def test_without_anything_it_is_the_local_gateway_without_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGL_URL", raising=False)
    monkeypatch.delenv("AGL_KEY", raising=False)
    assert ClientSettings.resolve() == ClientSettings(DEFAULT_URL, None)


@pytest.mark.parametrize("url", ["localhost:8100", "ftp://host", "http://"])
def test_an_invalid_url_is_a_config_error(url: str) -> None:
    with pytest.raises(ConfigError, match="invalid gateway URL"):
        ClientSettings.resolve(url)
