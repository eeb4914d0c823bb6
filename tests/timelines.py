"""A factory of synthetic request timelines with known stage times (ms), and run folders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from latlab.metrics.summary import summarize
from latlab.records.config import RunConfig
from latlab.records.folder import RunFolder
from latlab.records.summary import ClientCheck
from latlab.records.timeline import ConnectionTiming, Outcome, RequestTimeline, ServerTiming
from latlab.records.window import Window

MS = 1_000_000


def timeline(index: int, at: float, *, client_wait: float = 0.0, connect: float | None = None,
             upload: float = 0.5, download: float = 0.5, preprocess: float = 1.0,
             queue: float = 0.0, prefill: float = 10.0, tokens: int = 10, itl: float = 5.0,
             stalls: dict[int, float] | None = None, postprocess: float = 0.2,
             tail: float = 0.1, untimed: float = 0.0, prompt: int = 100,
             tenant: str | None = None, priority: int | None = None, server: bool = True,
             outcome: Outcome = Outcome.OK) -> RequestTimeline:
    """A streamed request scheduled at `at` ms whose stages take the given times.

    `connect` opens a new connection taking that long (None: a reused one); `stalls` adds
    time before the i-th token; `untimed` is server time its stages do not account for.
    """
    sent = at + client_wait + (connect or 0.0)
    received = sent + upload
    token_times = []
    t = received + preprocess + queue + prefill + download
    for i in range(tokens):
        if i:
            t += itl
        t += (stalls or {}).get(i, 0.0)
        token_times.append(t)
    decode = token_times[-1] - token_times[0]
    total = preprocess + queue + prefill + decode + postprocess + untimed
    usage = received + total + download
    r = RequestTimeline(
        id=f"r{index}", index=index, tenant=tenant, priority=priority,
        prompt_tokens_planned=prompt, max_tokens=tokens,
        scheduled_ns=_ns(at), sent_ns=_ns(sent), headers_ns=_ns(received + preprocess + download),
        connection=ConnectionTiming(new=connect is not None, connect_ns=_ns(connect or 0.0)),
        outcome=outcome,
    )
    if outcome != Outcome.OK:
        r.status = 429 if outcome == Outcome.HTTP_429 else 500
        r.error = f"synthetic {outcome}"
        r.done_ns = r.headers_ns
        return r
    for tt in token_times:
        r.add_token_event(_ns(tt))
    r.usage_ns, r.done_ns = _ns(usage), _ns(usage + tail)
    r.prompt_tokens, r.completion_tokens, r.tokens_from_usage = prompt, tokens, True
    if server:
        r.server = ServerTiming(preprocess=preprocess, queue=queue, prefill=prefill, decode=decode,
                                postprocess=postprocess, total=total)
    return r


def _ns(ms: float) -> int:
    return int(round(ms * MS))


def write_run(root: Path, records: Sequence[RequestTimeline], config: dict[str, Any] | None = None,
              summary: bool = True, client: dict[str, Any] | None = None) -> RunFolder:
    """A run folder holding `records` (and its summary.json unless `summary` is False)."""
    run = RunFolder.create(root, "test")
    run.write_config(RunConfig.model_validate(config if config is not None else {"rate": 10.0}))
    with run.record_writer() as writer:
        for r in records:
            writer.write(r)
    if summary:
        data = summarize(records, Window.of_run(records))
        if client is not None:
            data.client = ClientCheck.model_validate(client)
        run.write_summary(data)
    return run


def steady(n: int = 40, gap: float = 100.0, **stages: Any) -> list[RequestTimeline]:
    """`n` identical, well-spaced requests: a healthy run."""
    return [timeline(i, i * gap, **stages) for i in range(n)]


def eventful() -> list[RequestTimeline]:
    """Two tenants, growing prompts and queue, a few rejections: every chart has data."""
    records = [timeline(i, i * 20, tenant="ab"[i % 2], priority=i % 3, prompt=100 + 40 * i,
                        prefill=5 + 0.1 * i, queue=3 * i, tokens=12) for i in range(60)]
    return records + [timeline(60 + i, i * 100, outcome=Outcome.HTTP_429) for i in range(3)]
