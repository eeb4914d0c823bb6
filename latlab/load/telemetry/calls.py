"""The LLM calls in a trace latlab did not send (`latlab observe`), each as a request record.

A call is found by its spans:

* the model server's: a span with the GenAI latency attributes (vLLM's `llm_request`, latlab
  serve's), or the topmost span of a service whose spans are stage slices (SGLang's);
* the client's: a CLIENT span of OpenTelemetry's GenAI instrumentation
  (`opentelemetry-instrumentation-openai-v2`: `gen_ai.operation.name` chat or
  text_completion), with the model server's span under it.

The record spans what was seen of the call from the outside: the application's request when
one LLM call sits under an application's root span (its components are `app_trace`'s), else the
client's span, else the model server's own. Its server timing is the model server's
(`spans.model_timing`); a client span's time beyond the model server's is the network between
them (derived), split out of the application's `other`; a call seen only by its server has no
network (unavailable), a call seen only by its client no model stages: its time is the
model's, unsplit (`model_call`: "model server (unsplit)"), its first token the client's where
the span records it. Several LLM calls in one trace are an agent's task: each is a step (session =
the trace), its `execute_tool` spans the tool steps between them.

Times are each service's own wall clock (unix ns). The model server's first token is placed in
its caller's span; where the clocks disagree (the server's span does not fit inside its
caller's) it is centred in it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from latlab.load.telemetry import conventions as semconv
from latlab.load.telemetry.app_trace import application_of
from latlab.load.telemetry.call_outcome import outcome_of
from latlab.load.telemetry.spans import STAGE_NAMES, is_model_span, model_timing
from latlab.records.spans import Span
from latlab.records.timeline import RequestTimeline, ServerTiming, SessionStep

CHAT_OPERATIONS = {"chat": "chat", "text_completion": "completions",
                   "generate_content": "chat"}
TOOL_OPERATION = "execute_tool"
NS_PER_S = 1e9


@dataclass(slots=True)
class Call:
    """One LLM call: the spans of its trace, its client's span and its model server's (either
    may be missing) with the server's spans under it."""

    trace: list[Span]
    client: Span | None = None
    server: Span | None = None
    server_spans: list[Span] = field(default_factory=list)

    @property
    def outer(self) -> Span:
        """The call's own span, the client's where seen."""
        return self.client or self.server

    @property
    def id(self) -> str | None:
        """The id both sides know: the server's request id, the client's response id."""
        for s in self.server_spans:  # SGLang's `rid` is on the request's span, under the top
            rid = s.attributes.get(semconv.REQUEST_IDS[0]) or s.attributes.get(
                semconv.REQUEST_IDS[1])
            if isinstance(rid, str):
                return rid
        if self.client is not None:
            rid = self.client.attributes.get(semconv.RESPONSE_ID)
            return rid if isinstance(rid, str) else None
        return None


def is_client_call(s: Span) -> bool:
    return s.kind == "client" and s.attributes.get(semconv.OPERATION) in CHAT_OPERATIONS


def calls_of(trace: Sequence[Span]) -> list[Call]:
    """The LLM calls of one trace's spans, in the order they started."""
    by_id = {s.span_id: s for s in trace}
    servers = [s for s in trace if is_model_span(s)] or _stage_roots(trace, by_id)
    calls: list[Call] = []
    paired: set[str] = set()
    for server in servers:
        client = _ancestor(server, by_id, is_client_call)
        if client is not None:
            paired.add(client.span_id)
        calls.append(Call(list(trace), client, server, _subtree(server, trace)))
    by_response = {c.id: c for c in calls if c.client is None and c.id is not None}
    for s in trace:
        if is_client_call(s) and s.span_id not in paired:
            server_call = by_response.pop(s.attributes.get(semconv.RESPONSE_ID), None)
            if server_call is not None:  # the server's span a sibling: the context was the parent's
                server_call.client = s
            else:
                calls.append(Call(list(trace), s))
    return sorted(calls, key=lambda c: c.outer.start_ns)


def streamed(call: Call) -> bool | None:
    """Whether the call streamed, where its spans say (the GenAI client span's
    `gen_ai.request.stream`, or a first chunk's time only a stream has); None: unknown (the
    instrumentation's default spans, a model server's, do not record it)."""
    if call.client is None:
        return None
    stream = call.client.attributes.get(semconv.STREAM)
    if isinstance(stream, bool):
        return stream
    return True if semconv.TIME_TO_FIRST_CHUNK in call.client.attributes else None


def joined(client: Call, server: Call) -> Call:
    """A client's call and a server's call of another trace that share an id (the client did
    not propagate its trace): one call, the server's spans under the client's."""
    top = replace(server.server, parent_span_id=client.client.span_id)
    spans = [top if s is server.server else s for s in server.server_spans]
    return Call(client.trace + spans, client.client, top, spans)


def record_of(call: Call, index: int, step: SessionStep | None = None) -> RequestTimeline:
    """The call as a request record (see the module's doc)."""
    root = _application_root(call) if step is None else None
    outer = root or call.client or call.server
    model, cached = model_timing(call.server_spans) if call.server else (None, None)
    timing = model
    if root is not None:
        timing = _with_application(call, root, model)
    elif call.server is not None and call.client is None and model is not None:
        timing.total = None  # nobody's side of the network was seen
    if call.server is None:  # the client's span is all there is of the model's time
        timing = timing or ServerTiming(source=f"otlp:{call.client.service or 'unknown'}")
        timing.model_call = call.client.duration_ms
    r = RequestTimeline(id=call.id or outer.span_id, index=index, api=_api(call),
                        scheduled_ns=outer.start_ns, sent_ns=outer.start_ns,
                        done_ns=outer.end_ns, server=timing, trace_id=outer.trace_id,
                        server_request_id=call.id, cached_tokens=cached, session=step,
                        tenant=(root or call.client).service if (root or call.client) else None)
    r.outcome, r.error = outcome_of([s for s in (outer, call.client, call.server) if s])
    _tokens(r, call)
    if call.server is not None and model is not None:
        _token_times(r, call, model)
    elif call.client is not None:
        _client_first_token(r, call.client)
    return r


def steps_of(calls: list[Call]) -> list[SessionStep | None]:
    """Each call's step of its trace's task; None for a trace of one call."""
    if len(calls) < 2:
        return [None] * len(calls)
    trace_id = calls[0].trace[0].trace_id
    tools = sorted((s for s in calls[0].trace
                    if s.attributes.get(semconv.OPERATION) == TOOL_OPERATION),
                   key=lambda s: s.start_ns)
    steps, after = [], None
    for turn, call in enumerate(calls, 1):
        start = call.outer.start_ns
        between = [s for s in tools if after is not None and after <= s.start_ns < start]
        steps.append(SessionStep(trace_id, turn, len(calls), "agent", after,
                                 between[0].start_ns if between else None,
                                 between[-1].end_ns if between else None))
        after = call.outer.end_ns
    return steps


def _application_root(call: Call) -> Span | None:
    """The trace's root above the call when it is an application's (not the call's own, nor
    the model server's service)."""
    ids = {s.span_id for s in call.trace}
    roots = [s for s in call.trace if s.parent_span_id not in ids]
    if len(roots) != 1 or roots[0] is call.client or roots[0] is call.server:
        return None
    root = roots[0]
    if call.server is not None and root.service == call.server.service:
        return None
    return root


def _with_application(call: Call, root: Span, model: ServerTiming | None) -> ServerTiming:
    """The model's timing with the application's total and components; where the client's
    GenAI span and the model server's total are both seen, the network between them is
    taken out of the application's `other` and its total (decompose then derives it)."""
    llm = call.server or call.client
    llm_ms = model.total if model is not None and model.total is not None else llm.duration_ms
    app = application_of(call.trace, llm, llm_ms)
    timing = model or ServerTiming()
    if app is None:
        return timing
    total, parts, service = app
    if call.client is not None and call.server is not None and model is not None \
            and model.total is not None:
        network = max(0.0, call.client.duration_ms - model.total)
        total, parts["other"] = total - network, parts["other"] - network
    timing.total, timing.application = total, parts
    timing.source = f"otlp:{service}" + (f"+{model.source[5:]}" if model and model.source
                                         else "")
    return timing


def _tokens(r: RequestTimeline, call: Call) -> None:
    attrs = [s.attributes for s in (call.server, call.client) if s is not None]

    def first(*keys: str) -> int | None:
        return next((a[k] for a in attrs for k in keys
                     if isinstance(a.get(k), int) and not isinstance(a.get(k), bool)), None)

    r.prompt_tokens = first(*semconv.PROMPT)
    r.completion_tokens = first(*semconv.OUTPUT)
    r.max_tokens = first(semconv.MAX_TOKENS)
    r.tokens_from_usage = r.completion_tokens is not None


def _token_times(r: RequestTimeline, call: Call, model: ServerTiming) -> None:
    """The first and last token, from the server's span, on the record's clock."""
    s = call.server
    ttft = s.attributes.get(semconv.TTFT)
    if isinstance(ttft, (int, float)):
        first = s.start_ns + int(ttft * NS_PER_S)
    elif model.prefill is not None:
        first = s.start_ns + int(sum(v or 0.0 for v in (model.preprocess, model.queue,
                                                         model.prefill)) * 1e6)
    else:
        return
    r.first_token_ns = first + _shift(call)
    if model.decode is not None:
        r.last_token_ns = r.first_token_ns + int(model.decode * 1e6)
    if r.done_ns is not None:
        r.first_token_ns = min(r.first_token_ns, r.done_ns)
        r.last_token_ns = min(r.last_token_ns, r.done_ns) if r.last_token_ns else None


def _client_first_token(r: RequestTimeline, client: Span) -> None:
    """The client's own first chunk, where its GenAI span records it (the instrumentation's
    `gen_ai.response.time_to_first_chunk`, a streamed call's, in seconds)."""
    ttfc = client.attributes.get(semconv.TIME_TO_FIRST_CHUNK)
    if isinstance(ttfc, (int, float)) and not isinstance(ttfc, bool) and ttfc >= 0:
        r.first_token_ns = min(client.start_ns + int(ttfc * NS_PER_S), client.end_ns)


def _shift(call: Call) -> int:
    """What moves the server's span onto its caller's clock: nothing while it fits inside the
    client's span (after the start of its caller's, an HTTP client span ending at the
    response's headers), else centred in the client's span (after its caller's start)."""
    s, c = call.server, call.client
    caller = c or _ancestor(s, {x.span_id: x for x in call.trace},
                            lambda x: x.service != s.service)
    if caller is None or (caller.start_ns <= s.start_ns and (c is None or s.end_ns <= c.end_ns)):
        return 0
    if c is None:
        return caller.start_ns - s.start_ns
    return (c.start_ns + c.end_ns - s.start_ns - s.end_ns) // 2


def _api(call: Call) -> str:
    if call.client is not None:
        return CHAT_OPERATIONS[call.client.attributes[semconv.OPERATION]]
    return "chat" if (call.id or "").startswith("chatcmpl") else "completions"


def _ancestor(span: Span, by_id: dict[str, Span], wanted) -> Span | None:
    node = by_id.get(span.parent_span_id or "")
    while node is not None:
        if wanted(node):
            return node
        node = by_id.get(node.parent_span_id or "")
    return None


def _subtree(top: Span, trace: Sequence[Span]) -> list[Span]:
    children: dict[str, list[Span]] = {}
    for s in trace:
        children.setdefault(s.parent_span_id or "", []).append(s)
    out, todo = [], [top]
    while todo:
        node = todo.pop()
        out.append(node)
        todo += children.get(node.span_id, [])
    return out


def _stage_roots(trace: Sequence[Span], by_id: dict[str, Span]) -> list[Span]:
    """The topmost span of its service above each stage slice (SGLang's request spans)."""
    tops: Counter[str] = Counter()
    found: dict[str, Span] = {}
    for s in trace:
        if s.name.strip().lower() in STAGE_NAMES:
            top = s
            while (parent := by_id.get(top.parent_span_id or "")) is not None \
                    and parent.service == s.service:
                top = parent
            tops[top.span_id] += 1
            found[top.span_id] = top
    return [found[k] for k in tops]
