"""`/openapi.json`: FastAPI's description of the routes, plus the request bodies that the
handlers read and validate themselves (so FastAPI cannot see them)."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from latlab import __version__
from latlab.server.schemas import ErrorResponse

REF = "#/components/schemas/{model}"

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in (
        (400, "Invalid request"), (401, "Missing or wrong API key"),
        (403, "Cross-origin request refused"), (404, "Unknown model"),
        (408, "The body did not arrive in time"), (413, "The body is too large"),
        (415, "The body is not JSON"), (429, "At capacity: retry after Retry-After seconds"),
        (500, "The engine failed this request"), (503, "Warming up or shutting down"))
}


# One server-sent event (OpenAPI 3.1: a text/event-stream schema describes each event): its
# data is a JSON chunk, then `[DONE]`.
SSE_EVENT = {"type": "object", "required": ["data"],
             "properties": {"data": {"type": "string"}, "event": {"type": "string"},
                            "id": {"type": "string"}, "retry": {"type": "integer"}}}
METRICS = {200: {"description": "Prometheus text exposition format",
                 "content": {"text/plain": {"schema": {"type": "string"}}}}}


def request_body(model: type[BaseModel], streams: bool = True) -> dict[str, Any]:
    """`openapi_extra` of a route whose JSON body is `model`."""
    extra: dict[str, Any] = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}}
    if streams:
        extra["responses"] = {"200": {"content": {"text/event-stream": {"schema": SSE_EVENT}},
                                      "description": "JSON, or SSE when stream is true"}}
    return extra


def install_openapi(app: FastAPI, request_models: list[type[BaseModel]],
                    vocab_size: int) -> None:
    """/openapi.json with the request bodies, token ids bounded by the model's vocabulary."""
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=__version__, routes=app.routes,
                                 description="OpenAI-compatible API of latlab's engine.")
            _, defs = models_json_schema([(m, "validation") for m in request_models],
                                         ref_template=REF)
            defs = defs.get("$defs", {})
            if "CompletionRequest" in defs:
                _bound_ids(defs["CompletionRequest"]["properties"]["prompt"], vocab_size)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _bound_ids(node: Any, vocab_size: int) -> None:
    """Every integer in a prompt's schema is a token id: below `vocab_size`."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            node["maximum"] = vocab_size - 1
        for value in node.values():
            _bound_ids(value, vocab_size)
    elif isinstance(node, list):
        for value in node:
            _bound_ids(value, vocab_size)
