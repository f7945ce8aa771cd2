"""An endpoint declared once: its query parameters, its body, its status and media, its OpenAPI entry, all from the
one declaration; and an addon that declares one outside its routes is a ConfigError, not a silent 404."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import BaseModel, ConfigDict

from agl_lite.core.addons import AddonManager, LoadedAddon
from agl_lite.core.api import Call, Endpoints, Param
from agl_lite.core.flow import Flow, Response
from agl_lite.core.routes import HttpRoute, Scope
from agl_lite.errors import BadRequest, ConfigError
from agl_lite.store.openapi import document
from agl_lite.testing.flows import make_flow


class ThingIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    size: int = 1


class Things:
    table = Endpoints()

    @table.endpoint(
        "GET",
        "/api/things",
        Scope.ADMIN,
        query={"limit": Param("integer", 10, 1, 100), "kind": Param("string", enum=("a", "b"))},
    )
    async def things_list(self, call: Call) -> Any:
        """List things."""
        return {"query": dict(call.query)}

    @table.endpoint("POST", "/api/things", Scope.ADMIN, body=ThingIn, status=201)
    async def things_add(self, call: Call) -> Any:
        """Add a thing."""
        return {"name": call.body.name, "size": call.body.size}

    @table.endpoint(
        "POST", "/api/things/{name}/touch", Scope.ADMIN, body=ThingIn, empty_body={"name": "default"}
    )
    async def things_touch(self, call: Call) -> Any:
        """Touch a thing."""
        return {"path": call.params["name"], "body": call.body.name}

    @table.endpoint("GET", "/api/things.txt", Scope.PUBLIC, media="text/plain")
    async def things_raw(self, call: Call) -> Any:
        """As text."""
        return Response(200, call.flow.request.headers.copy(), body=b"things")

    routes = table.routes


OTHER = HttpRoute("other", "GET", "/api/other", Scope.ADMIN)


def _flow(method: str, path: str, **kwargs: Any) -> Flow:
    return make_flow(method, path, routes=(*Things.routes, OTHER), **kwargs)


async def _answer(flow: Flow) -> tuple[int, Any]:
    assert await Things.table.dispatch(Things(), flow)
    assert flow.response is not None
    assert flow.response.body is not None
    return flow.response.status, orjson.loads(flow.response.body)


async def test_declared_parameters_arrive_typed_with_their_defaults() -> None:
    assert await _answer(_flow("GET", "/api/things")) == (200, {"query": {"limit": 10, "kind": None}})
    flow = _flow("GET", "/api/things", query_string="limit=5&kind=b&limit=7")  # the last of repeated ones
    assert await _answer(flow) == (200, {"query": {"limit": 7, "kind": "b"}})


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("limit=1_000", "'limit' must be an integer"),
        ("limit=%2B5", "'limit' must be an integer"),
        ("limit=%205", "'limit' must be an integer"),
        ("limit=%D9%A3", "'limit' must be an integer"),  # an Arabic-Indic three
        ("limit=", "'limit' must be an integer"),
        ("limit=0", "'limit' must be between 1 and 100"),
        ("limit=101", "'limit' must be between 1 and 100"),
        ("kind=c", "'kind' must be one of 'a', 'b'"),
        ("kind=a%00", "'kind' must not hold a NUL character"),  # no backend's text holds one
        ("color=red", "unknown query parameter(s) ['color']; known: ['kind', 'limit']"),
    ],
)
async def test_a_bad_parameter_is_a_400_naming_it(query: str, message: str) -> None:
    with pytest.raises(BadRequest) as caught:
        await Things.table.dispatch(Things(), _flow("GET", "/api/things", query_string=query))
    assert message in caught.value.message


async def test_a_body_is_validated_into_its_model_and_answered_with_the_declared_status() -> None:
    assert await _answer(_flow("POST", "/api/things", json_body={"name": "x"})) == (
        201,
        {"name": "x", "size": 1},
    )
    for body, problem in [
        (b"", "a JSON body is required"),
        (b'{"name": 1}', "name: Input should be a valid string"),
        (b'{"name": "x", "colour": 1}', "colour: Extra inputs are not permitted"),
        (b'{"name": "x", "size": 123456789012345678901234567890}', "does not fit 64 bits"),
    ]:
        with pytest.raises(BadRequest, match=problem):
            await Things.table.dispatch(Things(), _flow("POST", "/api/things", body=body))


async def test_an_endpoint_may_take_no_body_for_a_default_one() -> None:
    flow = _flow("POST", "/api/things/t1/touch")
    assert await _answer(flow) == (200, {"path": "t1", "body": "default"})
    flow = _flow("POST", "/api/things/t1/touch", json_body={"name": "given"})
    assert await _answer(flow) == (200, {"path": "t1", "body": "given"})


async def test_a_handler_may_answer_whole_and_a_foreign_route_is_not_answered() -> None:
    flow = _flow("GET", "/api/things.txt")
    assert await Things.table.dispatch(Things(), flow)
    assert flow.response is not None
    assert flow.response.body == b"things"
    other = _flow("GET", "/api/other")
    assert not await Things.table.dispatch(Things(), other)
    assert other.response is None


def test_the_openapi_document_states_what_the_declaration_enforces() -> None:
    paths = document(Things.routes)["paths"]
    listed = paths["/api/things"]["get"]
    assert {p["name"]: p["schema"] for p in listed["parameters"]} == {
        "limit": {"type": "integer", "minimum": 1, "maximum": 100, "default": 10},
        "kind": {"type": "string", "enum": ["a", "b"]},
    }
    added = paths["/api/things"]["post"]
    assert added["requestBody"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/ThingIn"
    }
    assert "201" in added["responses"]
    assert "200" not in added["responses"]
    assert "text/plain" in paths["/api/things.txt"]["get"]["responses"]["200"]["content"]


def test_an_addon_whose_routes_miss_an_endpoint_is_a_config_error() -> None:
    class Late:
        table = Endpoints()
        routes = table.routes  # written above the endpoint: it would never be routed

        @table.endpoint("GET", "/api/late", Scope.ADMIN)
        async def late_get(self, call: Call) -> Any:
            """Late."""
            return {}

    with pytest.raises(
        ConfigError, match=r"addon 'late' declares endpoints \['late.get'\] that are not in its routes"
    ):
        AddonManager([LoadedAddon("late", Late())]).routes()
    assert [r.name for r in AddonManager([LoadedAddon("things", Things())]).routes()][:2] == [
        "things.list",
        "things.add",
    ]


@pytest.mark.parametrize(
    ("raw", "value"), [("0.5", 0.5), ("-2", -2.0), ("1e3", 1000.0), ("2.5E-3", 0.0025), ("4.8e+16", 4.8e16)]
)
def test_a_number_parameter_takes_what_json_writes(raw: str, value: float) -> None:
    """Any JSON number: the OpenAPI document says `number`, and a client (or a fuzzer) writes exponents."""
    assert Param("number").parse("x", raw) == value


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("1e999", "must be a finite number"),
        ("inf", "must be a number"),
        ("nan", "must be a number"),
        ("0x10", "must be a number"),
        ("1_0", "must be a number"),
    ],
)
def test_a_number_parameter_refuses_what_is_no_finite_json_number(raw: str, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        Param("number").parse("x", raw)


async def test_a_400_names_the_parameter_or_field_it_is_about() -> None:
    with pytest.raises(BadRequest) as caught:
        await Things.table.dispatch(Things(), _flow("GET", "/api/things", query_string="limit=0"))
    assert caught.value.body()["error"]["param"] == "limit"
    with pytest.raises(BadRequest) as caught:
        await Things.table.dispatch(Things(), _flow("POST", "/api/things", json_body={"name": 1}))
    assert caught.value.body()["error"]["param"] == "name"


def test_an_endpoint_is_named_after_its_handler_unless_named() -> None:
    table = Endpoints()

    @table.endpoint("GET", "/api/a", Scope.ADMIN)
    async def things_first(self: Any, call: Call) -> Any:
        """First line.

        The rest is not the summary."""

    @table.endpoint("GET", "/api/b", Scope.ADMIN, name="other")
    async def things_second(self: Any, call: Call) -> Any:
        """Second."""

    assert [(r.name, r.summary) for r in table.routes] == [
        ("things.first", "First line."),
        ("other", "Second."),
    ]


def test_an_endpoint_handler_without_a_docstring_is_refused() -> None:
    table = Endpoints()
    with pytest.raises(TypeError, match="things_get needs a docstring"):

        @table.endpoint("GET", "/api/things", Scope.ADMIN)
        async def things_get(self: Any, call: Call) -> Any:
            return {}
