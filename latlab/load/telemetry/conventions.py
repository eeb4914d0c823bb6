"""The span attributes latlab reads to make a call's record: OpenTelemetry's GenAI and HTTP
semantic conventions, vLLM's latencies (latlab serve's too), SGLang's request id. `KEPT`:
every one `latlab observe` reads, all that a span keeps while its trace waits
(`attributes.Kept`; `tests/test_waiting_spans.py` checks that the calls made from spans so
cut are those made from the whole spans).
"""

from __future__ import annotations

from latlab.load.telemetry.attributes import Kept

# A model server's latencies (seconds), by the stage they time
GENAI = {"queue": "gen_ai.latency.time_in_queue", "prefill": "gen_ai.latency.time_in_model_prefill",
         "decode": "gen_ai.latency.time_in_model_decode", "total": "gen_ai.latency.e2e",
         "preprocess": "latlab.latency.preprocess", "postprocess": "latlab.latency.postprocess"}
TTFT = "gen_ai.latency.time_to_first_token"
CACHED = "gen_ai.usage.cached_tokens"
OPERATION = "gen_ai.operation.name"
GENAI_CALL = (OPERATION, "gen_ai.system", "gen_ai.provider.name", "llm.request.type")
REQUEST_IDS = ("gen_ai.request.id", "rid")  # the model server's (SGLang's: `rid`)
RESPONSE_ID = "gen_ai.response.id"  # the client's: the server's id as it answered
STREAM = "gen_ai.request.stream"
TIME_TO_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
PROMPT = ("gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens")
OUTPUT = ("gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens")
MAX_TOKENS = "gen_ai.request.max_tokens"
MODEL = ("gen_ai.response.model", "gen_ai.request.model")
STATUS = ("http.response.status_code", "http.status_code")
ERROR_TYPE = "error.type"
ASGI_EVENT = "asgi.event.type"  # an ASGI receive or send: HTTP plumbing

KEPT = Kept(
    keys=frozenset({*GENAI.values(), TTFT, CACHED, *GENAI_CALL, *REQUEST_IDS, RESPONSE_ID,
                    STREAM, TIME_TO_FIRST_CHUNK, *PROMPT, *OUTPUT, MAX_TOKENS, *MODEL, *STATUS,
                    ERROR_TYPE, ASGI_EVENT}),
    labels=frozenset({*GENAI_CALL, *MODEL, ERROR_TYPE}))
