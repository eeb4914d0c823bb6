"""A small retrieval-augmented generation service, traced with OpenTelemetry, for latlab to
measure end to end.

    python examples/rag_app/app.py --llm-url http://127.0.0.1:8000 --port 8100 \\
        --otlp-endpoint http://127.0.0.1:4318/v1/traces

`POST /v1/chat/completions` (OpenAI's shape, streamed or not) embeds the last user message,
searches a numpy index of generated documents for the closest ones (exact cosine search),
fetches them from a simulated document store (`--lookup-ms`, a database's round trip), and
asks the model server at `--llm-url` (latlab serve, or any OpenAI-compatible one) with the
documents as a system message, relaying its answer as it streams. `GET /v1/models` lists the
model server's models, `GET /health` answers ok.

It calls the model with the `openai` client, as applications do, traced by OpenTelemetry's
official GenAI instrumentation (`opentelemetry-instrumentation-openai-v2`: a CLIENT span per
call with its `gen_ai.*` attributes: model, response id, token usage).

Every step is a span: OpenTelemetry's FastAPI instrumentation opens the request's server span
(a child of the caller's `traceparent`), the handler opens `embed`, `retrieval` and `fetch
documents`, the GenAI instrumentation the model call, and the aiohttp client instrumentation
(the `openai` client's aiohttp transport) the HTTP request under it, passing the trace on, so
the model server's own span (`latlab serve --otlp-endpoint`) nests under the call. The spans go
to `--otlp-endpoint` over OTLP/HTTP.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import re

import aiohttp
import numpy as np
import openai
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.aiohttp_client import AioHttpClientInstrumentor
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

SERVICE = "rag_app"
EXPORT_DELAY_MS = 200
_WORD = re.compile(r"[a-z]+")
# What the `openai` client's `create` takes by name; the rest of a request goes as its body.
CREATE = ("model", "messages", "stream", "stream_options", "max_tokens", "temperature", "top_p",
          "seed", "stop", "n")


def embed(text: str, dim: int) -> np.ndarray:
    """A bag of hashed words, unit length: the same text always gives the same vector."""
    v = np.zeros(dim, dtype=np.float32)
    for word in _WORD.findall(text.lower()):
        h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
        v[h % dim] += 1.0 if (h >> 32) & 1 else -1.0
    norm = np.linalg.norm(v)
    return v / norm if norm > 0 else v


class Index:
    """`docs` generated documents (random words) and their embeddings, searched exactly."""

    def __init__(self, docs: int, dim: int, words_per_doc: int = 24, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
        vocabulary = ["".join(rng.choice(letters, rng.integers(3, 9))) for _ in range(4000)]
        self.texts = [" ".join(vocabulary[i] for i in rng.integers(0, len(vocabulary),
                                                                   words_per_doc))
                      for _ in range(docs)]
        self.dim = dim
        self.vectors = np.stack([embed(t, dim) for t in self.texts])

    def search(self, query: np.ndarray, k: int) -> list[int]:
        """The `k` documents closest to `query` (cosine), best first."""
        scores = self.vectors @ query
        top = np.argpartition(-scores, min(k, len(scores) - 1))[:k]
        return [int(i) for i in top[np.argsort(-scores[top])]]


def create_app(llm_url: str, index: Index, top_k: int = 4, lookup_ms: float = 0.0) -> FastAPI:
    """The service; call `FastAPIInstrumentor.instrument_app` on it to trace it."""
    app = FastAPI(title="rag_app")
    tracer = trace.get_tracer("rag_app")
    llm = llm_url.rstrip("/")
    state: dict[str, aiohttp.ClientSession] = {}

    def client() -> aiohttp.ClientSession:
        if "session" not in state:  # made inside the loop, after the instrumentation
            state["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        return state["session"]

    def model_client() -> openai.AsyncOpenAI:
        if "openai" not in state:
            state["openai"] = openai.AsyncOpenAI(
                base_url=f"{llm}/v1", api_key="unused", max_retries=0, timeout=600,
                http_client=openai.DefaultAioHttpClient())
        return state["openai"]

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> Response:
        async with client().get(f"{llm}/v1/models") as resp:
            data = await resp.json()
        for m in data.get("data", []):  # the prompt the model sees is longer than the user's
            m["owned_by"] = SERVICE
            m.pop("max_model_len", None)
        return JSONResponse(data, status_code=resp.status)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        body = await request.json()
        question = str(body["messages"][-1].get("content") or "")
        with tracer.start_as_current_span("embed"):
            query = embed(question, index.dim)
        with tracer.start_as_current_span("retrieval") as span:
            found = index.search(query, top_k)
            span.set_attribute("rag.documents", len(index.texts))
        with tracer.start_as_current_span("fetch documents"):
            await asyncio.sleep(lookup_ms / 1e3)
            documents = [index.texts[i] for i in found]
        context = {"role": "system", "content": "Answer from these documents:\n"
                   + "\n".join(documents)}
        upstream = {**body, "messages": [context, *body["messages"]]}
        named = {k: v for k, v in upstream.items() if k in CREATE}
        try:
            answer = await model_client().chat.completions.create(
                **named, extra_body={k: v for k, v in upstream.items() if k not in CREATE},
                extra_headers={"X-Request-Id": request.headers.get("X-Request-Id", "")})
        except openai.APIStatusError as e:
            return Response(e.response.content, status_code=e.status_code,
                            media_type="application/json")
        if not body.get("stream"):
            return JSONResponse(answer.model_dump(exclude_unset=True))

        async def relay():
            async for chunk in answer:
                yield f"data: {chunk.model_dump_json(exclude_unset=True)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(relay(), media_type="text/event-stream")

    return app


def traced(app: FastAPI, otlp_endpoint: str | None, export_delay_ms: int = EXPORT_DELAY_MS
           ) -> FastAPI:
    """Trace `app`, its model calls and its HTTP calls, exporting to `otlp_endpoint`
    (OTLP/HTTP) in batches every `export_delay_ms` (the SDK's default: 5000)."""
    provider = TracerProvider(resource=Resource.create({"service.name": SERVICE}))
    if otlp_endpoint:
        provider.add_span_processor(BatchSpanProcessor(
            OTLPSpanExporter(endpoint=otlp_endpoint), schedule_delay_millis=export_delay_ms))
    trace.set_tracer_provider(provider)
    AioHttpClientInstrumentor().instrument(tracer_provider=provider)
    OpenAIInstrumentor().instrument(tracer_provider=provider)
    FastAPIInstrumentor.instrument_app(app, tracer_provider=provider,
                                       excluded_urls="health,v1/models",
                                       exclude_spans=["receive", "send"])
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llm-url", required=True, help="the model server (http://HOST:PORT)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8100)
    parser.add_argument("--docs", type=int, default=5000, help="documents in the index")
    parser.add_argument("--dim", type=int, default=256, help="embedding dimensions")
    parser.add_argument("--top-k", type=int, default=4, help="documents per answer")
    parser.add_argument("--lookup-ms", type=float, default=0.0,
                        help="the document store's latency per fetch (simulated)")
    parser.add_argument("--otlp-endpoint", default=None,
                        help="where to send the spans (OTLP/HTTP, e.g. latlab bench --otlp-port)")
    parser.add_argument("--export-delay-ms", type=int, default=EXPORT_DELAY_MS,
                        help="the span exporter's batch delay (the OpenTelemetry SDK's "
                             "default is 5000)")
    args = parser.parse_args()
    app = traced(create_app(args.llm_url, Index(args.docs, args.dim), args.top_k,
                            args.lookup_ms), args.otlp_endpoint, args.export_delay_ms)
    print(f"rag_app: ready on http://{args.host}:{args.port} ({args.docs} documents)",
          flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
