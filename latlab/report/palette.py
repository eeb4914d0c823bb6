"""One colour per bucket and component, shared by the terminal and the HTML report."""

BUCKET_COLORS = {
    "network": "#4c9be8",
    "gateway": "#6c71c4",
    "queue & overhead": "#f0a830",
    "application": "#2aa198",
    "prefill": "#c355c9",
    "decode": "#4cb86b",
    "prefill + decode (unsplit)": "#8a9f6a",
    "first token (unsplit)": "#9a9a9a",
    "model server (unsplit)": "#6b8e9f",
}

COMPONENT_COLORS = {
    "client_wait": "#f7d08a",
    "connect": "#9cc8f2",
    "tls": "#7fb2e5",
    "network": "#4c9be8",
    "gateway_intake": "#6c71c4",
    "gateway_tail": "#9b8fe0",
    "intake": "#c9a227",
    "preprocess": "#f3bd62",
    "queue": "#e0901a",
    "model_load": "#a0522d",
    "prefill": "#c355c9",
    "decode": "#4cb86b",
    "inference": "#8a9f6a",
    "postprocess": "#b3793a",
    "ttft_unsplit": "#9a9a9a",
    "model_call": "#6b8e9f",
    "unattributed": "#d9534f",
}

SEVERITY_COLORS = {"critical": "#d9534f", "warning": "#e0901a", "info": "#4c9be8"}

SLO_COLOR = "#d9534f"

OUTCOME_COLORS = {
    "ok": "#4cb86b",
    "http_4xx": "#b5651d",
    "http_429": "#e0901a",
    "http_5xx": "#d9534f",
    "timeout": "#8b1a1a",
    "connection_refused": "#6a3d9a",
    "connection_reset": "#9467bd",
    "stream_broken": "#e377c2",
    "bad_payload": "#8c564b",
    "empty": "#bcbd22",
    "unfinished": "#7f7f7f",
    "cancelled": "#9a9a9a",
    "client_error": "#17becf",
    "too_large": "#393b79",
}
