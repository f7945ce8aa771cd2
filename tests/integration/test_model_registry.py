"""Models registered in the store (what a weight sync writes) are routed beside routes.toml and stamp their
version on every captured call from the registration on; a restart keeps the registration."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import openai
import pytest
from openai import AsyncOpenAI

from agl_lite.service import running_gateway
from agl_lite.store.sqlite import SQLiteStore
from agl_lite.testing.gateway import write_config
from agl_lite.testing.mock_vllm import MockVLLM, running_mock
from tests.conftest import ADMIN_KEY, gateway_url

CHAIN = ("store", "auth", "store_api", "route", "capture", "sink")


async def _ask(gw_url: str, model: str) -> str:
    async with AsyncOpenAI(base_url=gw_url + "/v1", api_key=ADMIN_KEY, max_retries=0) as client:
        reply = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    return reply.id


async def _register(
    gw_url: str, name: str, endpoints: list[str], version: str, served_model: str | None = None
) -> None:
    body = {"name": name, "endpoints": endpoints, "version": version}
    if served_model is not None:
        body["served_model"] = served_model
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as s,
        s.post(gw_url + "/api/models", json=body) as r,
    ):
        assert r.status in (200, 201), await r.text()


async def _remove(gw_url: str, name: str) -> int:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as s,
        s.post(gw_url + "/api/models/remove", json={"name": name}) as r,
    ):
        return r.status


async def test_a_registration_names_what_its_servers_serve_and_can_be_taken_back(tmp_path: Path) -> None:
    """A trainer's weight sync: new servers that serve the model under another name (vLLM answers 404 to the
    registry's name), and the registration removed afterwards: a routes-file model goes back to its entry, a
    registered-only one goes away."""
    file_mock, synced = MockVLLM(("policy",)), MockVLLM(("Qwen/Qwen3-8B",))
    async with running_mock(file_mock) as file_url, running_mock(synced) as synced_url:
        config = write_config(
            tmp_path,
            {"policy": [file_url]},
            chain=CHAIN,
            addons={"store": {"path": str(tmp_path / "s.db")}},
        )
        async with running_gateway(config) as gw:
            url = gateway_url(gw)
            await _register(url, "policy", [synced_url], "step-1", served_model="Qwen/Qwen3-8B")
            await _ask(url, "policy")  # forwarded as the servers' own name (else: their 404)
            await _register(url, "scratch", [synced_url], "v1", served_model="Qwen/Qwen3-8B")
            await _ask(url, "scratch")
            assert synced.requests_total == 2
            assert [r.body["model"] for r in synced.requests] == ["Qwen/Qwen3-8B"] * 2
            assert await _remove(url, "policy") == 200
            await _ask(url, "policy")  # routes.toml's entry again
            assert file_mock.requests_total == 1
            assert await _remove(url, "scratch") == 200
            async with AsyncOpenAI(base_url=url + "/v1", api_key=ADMIN_KEY, max_retries=0) as client:
                with pytest.raises(openai.NotFoundError):
                    await client.chat.completions.create(
                        model="scratch", messages=[{"role": "user", "content": "hi"}], max_tokens=4
                    )
            assert await _remove(url, "scratch") == 404


async def test_a_registration_reroutes_and_versions_the_next_calls(tmp_path: Path) -> None:
    old, new = MockVLLM(("policy",)), MockVLLM(("policy", "fresh-model"))
    async with running_mock(old) as old_url, running_mock(new) as new_url:
        config = write_config(
            tmp_path,
            {"policy": [old_url]},
            aliases={"policy": ["gpt-4.1"]},
            chain=CHAIN,
            addons={"store": {"path": str(tmp_path / "s.db")}},
        )
        async with running_gateway(config) as gw:
            url = gateway_url(gw)
            await _ask(url, "gpt-4.1")
            await _register(url, "policy", [new_url], "step-7")
            await _ask(url, "gpt-4.1")  # the alias keeps working, now on the new endpoint
            await _register(url, "fresh-model", [new_url], "v1")  # not in routes.toml: a new route
            await _ask(url, "fresh-model")
            async with (
                aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as s,
                s.get(url + "/v1/models") as r,
            ):
                listed = {m["id"] for m in (await r.json())["data"]}
            assert {"policy", "gpt-4.1", "fresh-model"} <= listed
        assert (old.requests_total, new.requests_total) == (1, 2)

        async with running_gateway(config) as gw:  # a restart on the same store keeps the registration
            await _ask(gateway_url(gw), "policy")
        assert new.requests_total == 3

    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        calls = await store.calls(None)
    finally:
        await store.close()
    assert [(c.model, c.model_version) for c in calls] == [
        ("policy", None),
        ("policy", "step-7"),
        ("fresh-model", "v1"),
        ("policy", "step-7"),
    ]


async def test_a_static_version_in_routes_toml_is_recorded(tmp_path: Path) -> None:
    mock = MockVLLM(("policy",))
    async with running_mock(mock) as mock_url:
        config = write_config(
            tmp_path,
            {"policy": [mock_url]},
            chain=CHAIN,
            addons={"store": {"path": str(tmp_path / "s.db")}},
        )
        routes = tmp_path / "routes.toml"
        routes.write_text(
            routes.read_text().replace('strategy = "sticky"', 'strategy = "sticky"\nversion = "base"')
        )
        async with running_gateway(config) as gw:
            await _ask(gateway_url(gw), "policy")
    store = await SQLiteStore.open(tmp_path / "s.db")
    try:
        (call,) = await store.calls(None)
    finally:
        await store.close()
    assert call.model_version == "base"
