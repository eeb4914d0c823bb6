"""schemathesis's checks as latlab serve's suite runs them (loaded through SCHEMATHESIS_HOOKS):
all of them, with `positive_data_acceptance` replaced by one that also takes a 400 for the
rules a schema cannot state, each named by its error code (`schemas.CROSS_FIELD_CODES`: the
prompt and max_tokens beyond the context, min_tokens above max_tokens, messages the chat
template refuses)."""

from __future__ import annotations

import orjson
import schemathesis
from schemathesis.specs.openapi.checks import positive_data_acceptance

from latlab.server.schemas import CROSS_FIELD_CODES


@schemathesis.check
def positive_data_acceptance_but_cross_field_rules(ctx, response, case):
    if response.status_code == 400 and _code(response.content) in CROSS_FIELD_CODES:
        return None
    return positive_data_acceptance(ctx, response, case)


def _code(body: bytes) -> str | None:
    try:
        error = orjson.loads(body).get("error")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    return error.get("code") if isinstance(error, dict) else None
