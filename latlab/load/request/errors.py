"""An error in one line: an error response's message, an exception's class and message,
and the outcome class a failed request gets."""

from __future__ import annotations

import asyncio
import html
import re

import aiohttp
import orjson

from latlab.records.timeline import Outcome

ERROR_MESSAGE_CHARS = 300
_HTML_HIDDEN = re.compile(r"<(head|script|style)\b.*?</\1>", re.I | re.S)
_HTML_TAG = re.compile(r"<[^>]+>")


def error_message(body: bytes, limit: int = ERROR_MESSAGE_CHARS) -> str:
    """An error response in one short line: the message of a JSON error (OpenAI's
    `error.message`, TGI's `error`, FastAPI's `detail`), the visible text of an HTML page's
    body, else the text itself; whitespace collapsed, cut at `limit` characters."""
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = orjson.loads(body)
    except orjson.JSONDecodeError:
        obj = None
    if isinstance(obj, dict):
        inner = obj.get("error")
        found = (inner.get("message") if isinstance(inner, dict) else inner) or \
            obj.get("message") or obj.get("detail")
        text = found if isinstance(found, str) else text
    elif text.lstrip().startswith("<"):
        text = html.unescape(_HTML_TAG.sub(" ", _HTML_HIDDEN.sub(" ", text)))
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def classify(e: Exception, after_headers: bool) -> Outcome:
    """The outcome class of a request that raised `e` (after the response's headers came,
    or before)."""
    if isinstance(e, asyncio.TimeoutError):
        return Outcome.TIMEOUT
    if isinstance(e, aiohttp.ClientConnectorError):
        return Outcome.CONNECTION_REFUSED
    if isinstance(e, aiohttp.ClientPayloadError):
        return Outcome.STREAM_BROKEN
    if isinstance(e, (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError, ConnectionError)):
        return Outcome.STREAM_BROKEN if after_headers else Outcome.CONNECTION_RESET
    if isinstance(e, aiohttp.ClientResponseError):
        return Outcome.BAD_PAYLOAD
    return Outcome.CLIENT_ERROR


def describe(e: Exception) -> str:
    """An exception in one line: its class and message."""
    text = str(e) or repr(e)
    return f"{type(e).__name__}: {text}"
