"""Which columns a request table has, by kind, and the Arrow schema `requests.jsonl` is read
with (`records.reader`): one field per `RequestTimeline` field, nested as the record nests."""

from __future__ import annotations

import pyarrow as pa

from latlab.records.server_timing import GATEWAY_DURATIONS, SERVER_DURATIONS

TIMES = ("scheduled_ns", "sent_ns", "headers_ns", "first_token_ns", "last_token_ns", "usage_ns",
         "done_ns", "first_reasoning_ns", "first_answer_ns")
COUNTS = ("prompt_tokens_planned", "max_tokens", "priority", "status", "prompt_tokens",
          "cached_tokens", "completion_tokens")
# a connection's phases, and the round trip the kernel measured on its handshake (`rtt_ns`)
PHASES = ("pool_wait_ns", "dns_ns", "connect_ns", "tls_ns", "rtt_ns")
TEXT = ("id", "error", "server_request_id", "trace_id")
STEP_TIMES = ("after_ns", "tool_start_ns", "tool_end_ns")  # a session step's
TOKENS = ("token_ns", "token_counts", "token_offsets")  # flat: all requests' events
JOINED = ("text", "tool_error")  # Arrow columns: joined, never written in place

_i64, _f64, _str, _bool = pa.int64(), pa.float64(), pa.string(), pa.bool_()
SCHEMA = pa.schema(
    [("id", _str), ("index", _i64), ("worker", _i64), ("node", _str), ("api", _str),
     ("prompt_tokens_planned", _i64), ("max_tokens", _i64), ("fitted", _bool),
     ("tenant", _str), ("priority", _i64), *((t, _i64) for t in TIMES),
     ("connection", pa.struct([("new", _bool), *((p, _i64) for p in PHASES)])),
     ("token_ns", pa.list_(_i64)), ("token_counts", pa.list_(pa.int32())), ("outcome", _str),
     ("status", _i64), ("error", _str), ("prompt_tokens", _i64), ("cached_tokens", _i64),
     ("completion_tokens", _i64), ("tokens_from_usage", _bool),
     ("server", pa.struct([*((d, _f64) for d in (*SERVER_DURATIONS, *GATEWAY_DURATIONS)),
                           ("source", _str),
                           ("application", pa.map_(_str, _f64))])),
     ("server_request_id", _str), ("trace_id", _str), ("retries", _i64),
     ("session", pa.struct([("id", _str), ("turn", _i64), ("turns", _i64), ("kind", _str),
                            *((t, _i64) for t in STEP_TIMES), ("tool_error", _str)]))])
