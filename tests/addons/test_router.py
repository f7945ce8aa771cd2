from __future__ import annotations

import json
from pathlib import Path

import pytest

from agl_lite.addons.router import Router
from agl_lite.core.flow import Flow, UpstreamTarget
from agl_lite.errors import BadRequest, ConfigError, ModelNotFound
from agl_lite.service import load_config
from agl_lite.testing.flows import make_flow
from agl_lite.testing.gateway import write_config

A, B, C = "http://127.0.0.1:18001/v1", "http://127.0.0.1:18002/v1", "http://127.0.0.1:18003/v1"


def route_addon(tmp_path: Path, urls: list[str], *, strategy: str = "sticky", **options: object) -> Router:
    config = write_config(
        tmp_path,
        {"qwen": urls},
        aliases={"qwen": ["gpt-4.1"]},
        served_model={"qwen": "Qwen/Qwen2.5-1.5B"},
        strategy=strategy,
        addons={"route": options} if options else None,
    )
    addon = Router()
    addon.configure(config, Router.Options(**options))  # type: ignore[arg-type]
    return addon


def chat_flow(
    model: object = "gpt-4.1", path: str = "/v1/chat/completions", rollout: str | None = None
) -> Flow:
    f = make_flow("POST", path, json_body={"model": model, "messages": []}, routes=Router.routes)
    if rollout:
        f.metadata["auth.rollout_id"] = rollout
    return f


def targets(addon: Router, **kw: object) -> list[UpstreamTarget]:
    f = chat_flow(**kw)  # type: ignore[arg-type]
    addon.request(f)
    return f.upstreams


def test_alias_routes_to_the_served_model(tmp_path: Path) -> None:
    f = chat_flow()
    route_addon(tmp_path, [A]).request(f)
    (target,) = f.upstreams
    assert str(target.url) == A + "/chat/completions"
    assert target.json_patch == {"model": "Qwen/Qwen2.5-1.5B"}
    assert json.loads(f.request.upstream_body(target.json_patch))["model"] == "Qwen/Qwen2.5-1.5B"
    assert (f.metadata["route.model"], f.metadata["route.requested_model"]) == ("qwen", "gpt-4.1")
    assert f.metadata["route.backend"] == "vllm"


def test_attributed_path_forwards_the_api_suffix(tmp_path: Path) -> None:
    (target, *_) = targets(route_addon(tmp_path, [A]), path="/r/ro-1/a/at-1/v1/completions")
    assert str(target.url) == A + "/completions"


def test_unknown_model_lists_the_known_ones(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound) as info:
        route_addon(tmp_path, [A]).request(chat_flow("gpt-5"))
    assert info.value.body()["error"]["known_models"] == ["gpt-4.1", "qwen"]


@pytest.mark.parametrize("model", [None, 3, "", ["x"]])
def test_missing_or_invalid_model_is_400(tmp_path: Path, model: object) -> None:
    with pytest.raises(BadRequest, match="'model' is required"):
        route_addon(tmp_path, [A]).request(chat_flow(model))


def test_models_endpoint_lists_names_and_aliases(tmp_path: Path) -> None:
    f = make_flow("GET", "/v1/models", routes=Router.routes)
    route_addon(tmp_path, [A]).request(f)
    assert f.response is not None
    data = json.loads(f.response.body or b"")["data"]
    assert {(m["id"], m["root"]) for m in data} == {("qwen", "qwen"), ("gpt-4.1", "qwen")}


@pytest.mark.parametrize("path", ["/v1/models/gpt-4.1", "/r/ro-1/a/at-1/v1/models/gpt-4.1"])
def test_one_model_is_served_by_name_or_alias(tmp_path: Path, path: str) -> None:
    f = make_flow("GET", path, routes=Router.routes)
    route_addon(tmp_path, [A]).request(f)
    assert f.response is not None
    card = json.loads(f.response.body or b"")
    assert (card["id"], card["object"], card["root"]) == ("gpt-4.1", "model", "qwen")


def test_an_unknown_model_is_a_404_and_the_name_is_decoded(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFound, match="'org/x' is not routed here") as info:
        route_addon(tmp_path, [A]).request(make_flow("GET", "/v1/models/org%2Fx", routes=Router.routes))
    assert info.value.status == 404


def test_round_robin_rotates_the_first_choice(tmp_path: Path) -> None:
    addon = route_addon(tmp_path, [A, B, C], strategy="round_robin")
    firsts = [str(targets(addon)[0].url) for _ in range(6)]
    assert firsts == [u + "/chat/completions" for u in (A, B, C, A, B, C)]


def test_every_upstream_is_a_fallback(tmp_path: Path) -> None:
    assert len(targets(route_addon(tmp_path, [A, B, C], strategy="round_robin"))) == 3


def test_least_inflight_prefers_the_idle_upstream(tmp_path: Path) -> None:
    addon = route_addon(tmp_path, [A, B], strategy="least_inflight")
    busy = targets(addon)[0]
    assert busy.observer is not None
    busy.observer.attempt_started(busy)
    for _ in range(3):
        assert targets(addon)[0].name != busy.name


def test_sticky_keeps_a_rollout_on_one_upstream(tmp_path: Path) -> None:
    addon = route_addon(tmp_path, [A, B, C])
    chosen = {
        r: {targets(addon, rollout=r)[0].name for _ in range(5)} for r in (f"ro-{i}" for i in range(20))
    }
    assert all(len(names) == 1 for names in chosen.values())
    assert len(set().union(*chosen.values())) > 1  # different rollouts spread over upstreams


def test_failing_upstream_cools_down_and_is_tried_last(tmp_path: Path) -> None:
    addon = route_addon(tmp_path, [A, B], strategy="round_robin", failures_to_cool=2, cooldown_s=60.0)
    bad = next(t for t in targets(addon) if t.name == A)
    assert bad.observer is not None
    for _ in range(2):
        bad.observer.attempt_started(bad)
        bad.observer.attempt_ended(bad, ok=False)
    for _ in range(4):
        assert [t.name for t in targets(addon)] == [B, A]


def write_routes(tmp_path: Path, text: str) -> Path:
    (tmp_path / "routes.toml").write_text(text)
    (tmp_path / "agl-lite.toml").write_text("")
    return tmp_path / "agl-lite.toml"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[models.m]\nupstreams = []\n", "models.m.upstreams is empty"),
        ('[models.m]\nupstreams = [{ base_url = "localhost:8000" }]\n', "must be an http"),
        (
            '[models.m]\nupstreams = [{ base_url = "http://h/v1" }]\n[models.n]\naliases = ["m"]\n'
            'upstreams = [{ base_url = "http://h/v1" }]\n',
            "'m' is used by both",
        ),
        (
            '[models.m]\nstrategy = "random"\nupstreams = [{ base_url = "http://h/v1" }]\n',
            "strategy must be one of",
        ),
        (
            '[models.m]\nupstreams = [{ base_url = "http://h/v1", api_key_env = "NO_SUCH_VAR_X" }]\n',
            "NO_SUCH_VAR_X is not set",
        ),
        ('[models.m]\nupstream = [{ base_url = "http://h/v1" }]\n', "did you mean 'upstreams'"),
    ],
)
def test_bad_routes_file_names_the_problem(tmp_path: Path, text: str, message: str) -> None:
    config = load_config(write_routes(tmp_path, text))
    with pytest.raises(ConfigError, match=message) as info:
        Router().configure(config, Router.Options())
    assert "routes.toml" in str(info.value)


def test_upstream_key_comes_from_its_env_var(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_KEY_X", "sk-upstream")
    config = load_config(
        write_routes(
            tmp_path,
            '[models.m]\nupstreams = [{ base_url = "http://h/v1", api_key_env = "UPSTREAM_KEY_X" }]\n',
        )
    )
    addon = Router()
    addon.configure(config, Router.Options())
    assert targets(addon, model="m")[0].headers == {"Authorization": "Bearer sk-upstream"}
