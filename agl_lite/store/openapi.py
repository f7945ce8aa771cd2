"""The OpenAPI 3.1 document of the service, generated from the route table: each route's body model, query
parameters, status and media type are the ones its endpoint declared (`core.api`), the ones it enforces."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agl_lite import __version__
from agl_lite.core.routes import HttpRoute, RouteKind, Scope, path_params, path_template

__all__ = ["JSON_VALUE", "JSON_VALUE_REF", "document"]


def _error(code: dict[str, Any], required: tuple[str, ...], **more: Any) -> dict[str, Any]:
    members = {"type": {"type": "string"}, "message": {"type": "string"}, "code": code, **more}
    error = {"type": "object", "required": ["type", "message", *required], "properties": members}
    return {"type": "object", "required": ["error"], "properties": {"error": error}}


ERROR = _error({"type": "integer"}, ("code",))
OPENAI_ERROR = _error(
    {
        "type": ["string", "integer", "null"],
        "description": "What went wrong, as a string; the status (an integer) when the path matched no route at "
        "all, which the gateway answers in its own shape",
    },
    (),
    param={"type": ["string", "null"]},
)
"""The errors of a translated OpenAI API (the Responses API): OpenAI's shape, a string `code`."""

JSON_VALUE_REF = "#/components/schemas/JsonValue"
JSON_VALUE = {
    "description": "Any JSON value whose integers fit 64 bits (the store keeps numbers as they came; a wider "
    "integer is a 400: send it as a string).",
    "anyOf": [
        {"type": "null"},
        {"type": "boolean"},
        {"type": "string"},
        {"type": "integer", "minimum": -(2**63), "maximum": 2**64 - 1},
        {"type": "number", "not": {"type": "integer"}},
        {"type": "array", "items": {"$ref": JSON_VALUE_REF}},
        {"type": "object", "additionalProperties": {"$ref": JSON_VALUE_REF}},
    ],
}
"""What the payloads' free-form fields (`input`, `metadata`, `data`, ...) take."""


def document(routes: Iterable[HttpRoute]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    schemas: dict[str, Any] = {"Error": ERROR, "OpenAIError": OPENAI_ERROR, "JsonValue": JSON_VALUE}
    for route in routes:
        if route.kind is RouteKind.PAGE:
            continue
        op: dict[str, Any] = {
            "operationId": route.name,
            "summary": route.summary,
            "tags": [route.kind.value, route.scope.value],
            "responses": {
                "default": {
                    "description": "An error",
                    "content": {
                        "application/json": {"schema": {"$ref": f"#/components/schemas/{route.errors}"}}
                    },
                },
                "200": {"description": "OK", "content": {"application/json": {"schema": {}}}},
            },
        }
        if route.scope is not Scope.PUBLIC:
            op["security"] = [{"bearer": []}, {"apiKey": []}]
        params = [
            {
                "name": p,
                "in": "path",
                "required": True,
                "schema": {"type": "string", "pattern": f"^{value}$"},
            }
            for p, value in path_params(route.path)
        ]
        params += [
            {"name": n, "in": "query", "required": False, "schema": p.schema()}
            for n, p in route.query.items()
        ]
        if params:
            op["parameters"] = params
        model = route.body
        if model is not None:
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas[model.__name__] = schema
            op["requestBody"] = {
                "required": True,
                "content": {
                    "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
                },
            }
        elif route.kind is RouteKind.LLM:
            op["requestBody"] = {
                "required": True,
                "content": {"application/json": {"schema": {"type": "object"}}},
            }
        if route.media != "application/json":
            op["responses"]["200"]["content"] = {route.media: {"schema": {"type": "string"}}}
        if route.method == "HEAD":  # no body, whatever the status
            op["responses"] = {"200": {"description": "OK"}, "default": {"description": "An error"}}
        if route.status != 200:
            op["responses"][str(route.status)] = op["responses"].pop("200")
        paths.setdefault(path_template(route.path), {})[route.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "agl-lite", "version": __version__},
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }
