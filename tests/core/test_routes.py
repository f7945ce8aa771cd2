from __future__ import annotations

import pytest

from agl_lite.core import routes as routes_module
from agl_lite.core.routes import ID_PATTERN, HttpRoute, RouteKind, RouteTable, Scope, model_api_routes
from agl_lite.errors import BadRequest, ConfigError, MethodNotAllowed, NotFound
from agl_lite.store.rules import _check_id

TABLE = RouteTable(
    [
        HttpRoute("healthz", "GET", "/healthz", Scope.PUBLIC),
        *model_api_routes("chat", "POST", "/v1/chat/completions", RouteKind.LLM),
    ]
)


def test_static_path_matches() -> None:
    assert TABLE.match("GET", "/healthz").route.name == "healthz"


def test_attributed_path_yields_rollout_and_attempt() -> None:
    match = TABLE.match("POST", "/r/ro-1/a/att_2/v1/chat/completions")
    assert match.route.name == "chat.agent"
    assert match.route.scope is Scope.AGENT
    assert dict(match.params) == {"rollout_id": "ro-1", "attempt_id": "att_2"}


def test_unknown_path_is_not_found() -> None:
    with pytest.raises(NotFound):
        TABLE.match("GET", "/v2/nothing")


def test_wrong_method_lists_allowed_methods() -> None:
    with pytest.raises(MethodNotAllowed) as info:
        TABLE.match("GET", "/v1/chat/completions")
    assert info.value.headers == {"Allow": "POST"}


def test_head_is_served_by_get() -> None:
    assert TABLE.match("HEAD", "/healthz").route.name == "healthz"


@pytest.mark.parametrize("rollout", ["a.b", "a%2Fb", "", "x" * 129])
def test_ids_outside_the_safe_charset_do_not_match(rollout: str) -> None:
    with pytest.raises(NotFound):
        TABLE.match("POST", f"/r/{rollout}/a/1/v1/chat/completions")


def test_duplicate_route_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="declared twice"):
        RouteTable([HttpRoute("a", "GET", "/x", Scope.PUBLIC), HttpRoute("b", "GET", "/x", Scope.ADMIN)])


@pytest.mark.parametrize("tail", ["\n", "\r\n", "\n/x"])
def test_a_path_with_a_trailing_newline_matches_no_route(tail: str) -> None:
    """Issue #15 H4: `…/v1/chat/completions%0A` matched the agent route (`$` matches before a final newline), was
    forwarded and went uncaptured; it is a 404 like any other unknown path."""
    with pytest.raises(NotFound):
        TABLE.match("POST", "/r/ro-1/a/at-1/v1/chat/completions" + tail)


def test_an_id_with_a_trailing_newline_is_not_an_id() -> None:
    assert ID_PATTERN.fullmatch("ro-1") is not None
    assert ID_PATTERN.fullmatch("ro-1\n") is None
    with pytest.raises(BadRequest):
        _check_id("rollout", "ro-1\n")


def test_a_remembered_dynamic_path_matches_as_it_did_and_the_memory_is_bounded() -> None:
    table = RouteTable([HttpRoute("x", "POST", "/r/{rollout_id}/a/{attempt_id}/v1/x", Scope.AGENT)])
    first = table.match("POST", "/r/ro-1/a/at-1/v1/x")
    again = table.match("POST", "/r/ro-1/a/at-1/v1/x")
    assert (again.route, dict(again.params)) == (first.route, {"rollout_id": "ro-1", "attempt_id": "at-1"})
    with pytest.raises(MethodNotAllowed):
        table.match("GET", "/r/ro-1/a/at-1/v1/x")  # the method is still checked
    for i in range(routes_module._SEEN_PATHS + 10):
        table.match("POST", f"/r/ro-{i}/a/at/v1/x")
    assert len(table._seen) <= routes_module._SEEN_PATHS
    with pytest.raises(NotFound):
        table.match("POST", "/r/ro-1/a/at-1/v1/x\n")


MODELS = RouteTable(model_api_routes("model", "GET", "/v1/models/{model:path}", RouteKind.API))


@pytest.mark.parametrize(
    "model", ["gpt-4.1", "Qwen/Qwen2.5-0.5B-Instruct", "Qwen%2FQwen2.5-0.5B", "org/sub/m:v1", "a" * 512]
)
def test_a_path_parameter_takes_the_rest_of_the_path_dots_and_slashes_too(model: str) -> None:
    assert dict(MODELS.match("GET", f"/v1/models/{model}").params) == {"model": model}
    agent = MODELS.match("GET", f"/r/ro-1/a/at-1/v1/models/{model}")
    assert dict(agent.params) == {"rollout_id": "ro-1", "attempt_id": "at-1", "model": model}


@pytest.mark.parametrize(
    "path", ["/v1/models/", "/v1/models/a b", "/v1/models/x\n", "/v1/models/" + "a" * 513]
)
def test_a_path_parameter_is_bounded_and_printable(path: str) -> None:
    with pytest.raises(NotFound):
        MODELS.match("GET", path)


def test_an_id_parameter_still_takes_one_segment_only() -> None:
    """The rollout and attempt ids before a path parameter keep their own pattern: no slash, no dot."""
    for path in ("/r/ro.1/a/at-1/v1/models/m", "/r/ro/1/a/at-1/v1/models/m"):
        with pytest.raises(NotFound):
            MODELS.match("GET", path)
    assert routes_module.path_params("/r/{rollout_id}/x/{rest:path}") == [
        ("rollout_id", routes_module._SEGMENT),
        ("rest", routes_module.PATH_PARAM),
    ]
    assert routes_module.path_template("/r/{rollout_id}/x/{rest:path}") == "/r/{rollout_id}/x/{rest}"
