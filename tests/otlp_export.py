"""An OTLP/JSON export request of latlab serve's spans, for tests that post to `latlab observe`."""

import orjson

S = 10**9


def export(trace_ids: list[str], start_ns: int) -> bytes:
    """An OTLP/JSON export request of latlab serve's `llm_request` spans, one call each."""
    def attr(key, value):
        kind = "stringValue" if isinstance(value, str) else "doubleValue"
        return {"key": key, "value": {kind: value}}

    return orjson.dumps({"resourceSpans": [{
        "resource": {"attributes": [attr("service.name", "latlab-serve")]},
        "scopeSpans": [{"spans": [{
            "traceId": trace, "spanId": trace[16:], "name": "llm_request", "kind": 2,
            "startTimeUnixNano": str(start_ns), "endTimeUnixNano": str(start_ns + S // 2),
            "attributes": [attr("gen_ai.request.id", f"chatcmpl-{trace}"),
                           attr("gen_ai.latency.time_in_queue", 0.01),
                           attr("gen_ai.latency.time_to_first_token", 0.06),
                           attr("gen_ai.latency.e2e", 0.5)]}
            for trace in trace_ids]}]}]})
