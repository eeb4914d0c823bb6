"""`latlab observe`'s notes: what arrived and what became of it, in words (observe.json's
`notes`, summary.json's, printed at the end)."""

from __future__ import annotations

from latlab.records.observe import ObserveRecord


def notes_on(r: ObserveRecord) -> list[str]:
    """What the user should know of what arrived and what became of it."""
    notes = []
    if not r.spans and r.source.startswith("--from"):
        notes.append(f"no span latlab could read in {r.source[7:]}")
    elif not r.spans:
        notes.append(f"no span arrived at {r.source}: point the services' OTLP/HTTP trace "
                     "exporters there (OTEL_EXPORTER_OTLP_TRACES_ENDPOINT)")
    elif not r.calls:
        notes.append(f"{r.spans:,} spans in {r.traces:,} traces, none an LLM call: latlab knows "
                     "a call by a model server's span (vLLM's llm_request, latlab serve's, "
                     "SGLang's) or a GenAI client span (opentelemetry-instrumentation-openai-v2)")
    if r.unseen_model:
        notes.append(f"{r.unseen_model:,} calls without their model server's spans: their model "
                     "time is the client's, unsplit (export the model server's spans too)")
    if r.late:
        notes.append(f"{r.late:,} calls arrived after their window was written (later than "
                     "the calls before them had been, or than --max-lateness): in "
                     "requests.jsonl, in no window (a stalled exporter, or clocks apart?)")
    if r.split_traces:
        notes.append(f"{r.split_traces:,} traces had spans arrive after they were explained "
                     f"(split: the rest counted apart); the trace wait grew to "
                     f"{r.trace_wait_s:g} s (--trace-wait fixes it)")
    if r.forced:
        notes.append(f"{r.forced:,} traces explained before they were complete, to keep memory "
                     "bounded (--max-pending-spans)")
    if r.malformed:
        notes.append(f"{r.malformed:,} calls left out: their spans end before they start, or "
                     "carry no time")
    if r.throttled:
        notes.append(f"{r.throttled:,} export requests refused while {r.source} was behind "
                     "(503: exporters send them again; a sustained rate above what one core "
                     "explains loses spans once their retries give up)")
    if r.rejected:
        notes.append(f"{r.rejected:,} bodies or lines held no spans latlab could read "
                     f"(first: {r.first_rejection})")
    return notes
