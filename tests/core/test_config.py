from __future__ import annotations

from pathlib import Path

import pytest

from agl_lite.addons import DEFAULT_CHAIN
from agl_lite.core.config import GatewayConfig
from agl_lite.errors import ConfigError
from agl_lite.service import load_config


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agl-lite.toml"
    path.write_text(text)
    return path


def test_empty_file_gives_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, ""))
    assert config.server == GatewayConfig().server
    assert config.chain == DEFAULT_CHAIN
    assert config.chain[:2] == ("store", "auth")
    assert config.routes_path == tmp_path / "routes.toml"


def test_values_are_parsed_into_frozen_dataclasses(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, "[server]\nport = 9000\n[upstream]\nread_timeout = 5\n"))
    assert config.server.port == 9000
    assert config.upstream.read_timeout == 5.0
    with pytest.raises(AttributeError):
        config.server.port = 1  # type: ignore[misc]


def test_unknown_key_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[server]\nprot = 9000\n")
    with pytest.raises(
        ConfigError, match=r"agl-lite.toml: unknown key 'server.prot' \(did you mean 'port'\?\)"
    ):
        load_config(path)


def test_wrong_type_names_key_and_expected_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server.port must be an integer, got str '80'"):
        load_config(write(tmp_path, '[server]\nport = "80"\n'))


def test_bool_is_not_an_integer(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"server\.port must be an integer"):
        load_config(write(tmp_path, "[server]\nport = true\n"))


def test_literal_lists_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"log\.format must be one of 'console', 'json'"):
        load_config(write(tmp_path, '[log]\nformat = "xml"\n'))


def test_invalid_toml_names_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="invalid TOML"):
        load_config(write(tmp_path, "[server\n"))


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.toml")


def test_options_for_an_addon_not_in_the_chain(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"\[addons.route\] configures an addon that is not in addons.chain"
    ):
        load_config(write(tmp_path, '[addons]\nchain = ["auth"]\n[addons.route]\ncooldown_s = 1.0\n'))


def test_public_url_defaults_to_listen_address(tmp_path: Path) -> None:
    assert (
        load_config(write(tmp_path, '[server]\nhost = "0.0.0.0"\nport = 81\n')).public_url
        == "http://127.0.0.1:81"
    )
    config = load_config(write(tmp_path, '[server]\npublic_url = "http://gw.example:8100/"\n'))
    assert config.public_url == "http://gw.example:8100"


def test_extra_addons_join_the_chain_before_its_sink_or_at_its_end(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, '[addons]\nextra = ["myco.audit:Audit"]\n'))
    assert config.chain == DEFAULT_CHAIN
    assert config.full_chain == (*DEFAULT_CHAIN[:-1], "myco.audit:Audit", "sink")
    config = load_config(write(tmp_path, '[addons]\nchain = ["auth", "route"]\nextra = ["x:Y", "x:Z"]\n'))
    assert config.full_chain == ("auth", "route", "x:Y", "x:Z")


def test_an_extra_addons_options_table_is_accepted_and_an_unknown_one_refused(tmp_path: Path) -> None:
    text = '[addons]\nextra = ["x:Y"]\n\n[addons."x:Y"]\npath = "a"\n'
    assert load_config(write(tmp_path, text)).addons == {"x:Y": {"path": "a"}}
    with pytest.raises(ConfigError, match=r"\[addons.x:Z\] configures an addon that is not in addons.chain"):
        load_config(write(tmp_path, '[addons]\nextra = ["x:Y"]\n\n[addons."x:Z"]\npath = "a"\n'))


def test_a_config_that_names_no_chain_gets_the_default_one_from_whoever_builds_it(tmp_path: Path) -> None:
    """The core knows no addon: its loader leaves the chain open, the product's loader and builder fill it."""
    from agl_lite.core import config as core_config
    from agl_lite.service import build_gateway

    path = write(tmp_path, "[addons.capture]\nlogprobs = true\n")
    open_chain = core_config.load_config(path)
    assert open_chain.chain is None
    assert load_config(path).chain == DEFAULT_CHAIN
    built = build_gateway(GatewayConfig())
    assert [item.name for item in built.addons.addons] == list(DEFAULT_CHAIN)
    assert build_gateway(open_chain).config.chain == DEFAULT_CHAIN
    with pytest.raises(
        ConfigError, match=r"\[addons.capture\] configures an addon that is not in addons.chain"
    ):
        build_gateway(GatewayConfig(chain=("auth",), addons={"capture": {}}))
