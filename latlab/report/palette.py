"""One colour per bucket and component, shared by the terminal and the HTML report."""

BUCKET_COLORS = {
    "network": "#4c9be8",
    "queue & overhead": "#f0a830",
    "prefill": "#c355c9",
    "decode": "#4cb86b",
    "prefill + decode (unsplit)": "#8a9f6a",
    "first token (unsplit)": "#9a9a9a",
}

COMPONENT_COLORS = {
    "client_wait": "#f7d08a",
    "connect": "#9cc8f2",
    "network": "#4c9be8",
    "intake": "#c9a227",
    "preprocess": "#f3bd62",
    "queue": "#e0901a",
    "model_load": "#a0522d",
    "prefill": "#c355c9",
    "decode": "#4cb86b",
    "inference": "#8a9f6a",
    "postprocess": "#b3793a",
    "ttft_unsplit": "#9a9a9a",
    "unattributed": "#d9534f",
}

SEVERITY_COLORS = {"critical": "#d9534f", "warning": "#e0901a", "info": "#4c9be8"}
