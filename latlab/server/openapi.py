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


def request_body(model: type[BaseModel], streams: bool = True) -> dict[str, Any]:
    """`openapi_extra` of a route whose JSON body is `model`."""
    extra: dict[str, Any] = {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}}}}
    if streams:
        extra["responses"] = {"200": {"content": {"text/event-stream": {
            "schema": {"type": "string"}}}, "description": "JSON, or SSE when stream is true"}}
    return extra


def install_openapi(app: FastAPI, request_models: list[type[BaseModel]]) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=__version__, routes=app.routes,
                                 description="OpenAI-compatible API of latlab's engine.")
            _, defs = models_json_schema([(m, "validation") for m in request_models],
                                         ref_template=REF)
            schema.setdefault("components", {}).setdefault("schemas", {}).update(
                defs.get("$defs", {}))
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
