"""The request path: send one request and time it as its bytes arrive (HTTP, SSE, Ollama's
NDJSON, connection phases, read stamps, the server's own timings)."""
