"""Every metric's definition, quoted by `latlab bench --explain`, summary.json and reports."""

FORMULAS: dict[str, str] = {
    "ttft": "first_token − sent: first SSE event carrying ≥1 generated token",
    "ttft_sched": "first_token − scheduled: TTFT including client-side waiting",
    "e2e": "done − sent: stream closed after [DONE]",
    "e2e_sched": "done − scheduled: E2E including client-side waiting",
    "tpot": "(last_token − first_token) / (output_tokens − 1), output_tokens ≥ 2 (usage count)",
    "itl": "per token: the gap before an event carrying k tokens gives k samples of gap/k; pooled",
    "itl_request_mean": "mean of one request's ITL samples, one value per request",
    "chunk_gap": "raw gap between consecutive token-carrying SSE events (inter-chunk latency)",
    "lateness": "sent − scheduled: how late the client sent against the schedule",
    "output_tokens_per_s": "output tokens of token events inside the window / window length",
    "goodput": "requests that succeeded and met every SLO, completed in the window / window length",
    "failure_adjusted": "percentile with every failed request counted as infinitely slow",
}
