"""How an observed LLM call ended, from what its spans recorded: an HTTP status, else the
error the GenAI instrumentation named (the OpenAI client's exception)."""

from __future__ import annotations

from collections.abc import Sequence

from latlab.load.telemetry.conventions import ERROR_TYPE, STATUS
from latlab.records.spans import Span
from latlab.records.timeline import Outcome

# The OpenAI client's exception names (the GenAI instrumentation's `error.type`), by outcome.
ERROR_TYPES = (("ratelimit", Outcome.HTTP_429), ("internalserver", Outcome.HTTP_5XX),
               ("timeout", Outcome.TIMEOUT), ("connection", Outcome.CONNECTION_REFUSED),
               ("badrequest", Outcome.HTTP_4XX), ("notfound", Outcome.HTTP_4XX),
               ("authentication", Outcome.HTTP_4XX), ("permissiondenied", Outcome.HTTP_4XX),
               ("unprocessable", Outcome.HTTP_4XX), ("conflict", Outcome.HTTP_4XX))


def outcome_of(spans: Sequence[Span]) -> tuple[Outcome, str | None]:
    """How the call ended, from the HTTP status and errors its spans recorded (its own
    span first)."""
    for s in spans:
        status = next((s.attributes[k] for k in STATUS if k in s.attributes), None)
        if isinstance(status, int) and status >= 400:
            kind = (Outcome.HTTP_429 if status == 429 else
                    Outcome.HTTP_5XX if status >= 500 else Outcome.HTTP_4XX)
            return kind, f"{s.name}: HTTP {status}"
    for s in spans:
        if s.status == "error":
            error = str(s.attributes.get(ERROR_TYPE) or "error")
            kind = next((o for name, o in ERROR_TYPES if name in error.lower()),
                        Outcome.CLIENT_ERROR)
            return kind, f"{s.name}: {error}"
    return Outcome.OK, None
