"""How a bench run's requests are asked and travel (`config.json` → `bench`): the model and
token, the caps on a response, streaming, kept connections, whose server timings to read, TLS.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, SecretStr, model_validator

from latlab.records.settings import CLIENT, setting
from latlab.records.target import ServerKind

MIB = 1 << 20
MAX_EVENT_MIB, MAX_RESPONSE_MIB = 16.0, 64.0  # what one response may take of bench's memory


class RequestConfig(BaseModel):
    """How each request is asked."""

    model: str | None = setting(None, "Model name to request (default: the first the server "
                                "lists at /v1/models).", group=CLIENT)
    api_key: SecretStr | None = setting(None, "Bearer token for the target (never stored; "
                                        "seen in `ps`: prefer the environment or "
                                        "--api-key-file).", group=CLIENT,
                                        envvar=("LATLAB_API_KEY", "OPENAI_API_KEY"),
                                        cli_type=str | None, exclude=True)
    api_key_file: Path | None = setting(None, "Read the bearer token from this file's first "
                                        "line.", group=CLIENT)
    timeout_s: float = setting(300.0, "Per-request timeout in seconds.", group=CLIENT, gt=0)
    ignore_eos: bool = setting(True, "Send ignore_eos and min_tokens to hold the output "
                               "length.", group=CLIENT)
    continuous_usage: bool = setting(True, "Ask for cumulative usage in every chunk (tokens "
                                     "per event).", group=CLIENT)
    max_event_mib: float = setting(MAX_EVENT_MIB, "Most MiB of one SSE event (or NDJSON line); a "
                                   "request with a larger one fails as too_large.",
                                   group=CLIENT, gt=0)
    max_response_mib: float = setting(MAX_RESPONSE_MIB, "Most MiB of one response; a request whose "
                                      "response runs longer fails as too_large.",
                                      group=CLIENT, gt=0)

    @model_validator(mode="after")
    def _key_file(self) -> RequestConfig:
        if self.api_key_file is not None and self.api_key is None:
            try:
                line = self.api_key_file.read_text().splitlines()[:1]
            except OSError as e:
                raise ValueError(f"--api-key-file {self.api_key_file}: "
                                 f"{e.strerror or e}") from None
            if not line or not line[0].strip():
                raise ValueError(f"--api-key-file {self.api_key_file}: the first line is empty")
            self.api_key = SecretStr(line[0].strip())
        return self

    def key(self) -> str | None:
        return self.api_key.get_secret_value() if self.api_key else None

    def size_limits(self) -> dict[str, int]:
        """The caps on one event and one response, in bytes (`Client`'s keywords)."""
        return {"max_event_bytes": int(self.max_event_mib * MIB),
                "max_response_bytes": int(self.max_response_mib * MIB)}


class TransportConfig(RequestConfig):
    """How the load generator's requests travel: streamed or not, over kept connections or
    not, and whose server timings to read."""

    stream: bool = setting(True, "Stream the answers; without, a request's first token is its "
                           "whole answer (TTFT = E2E), as TGI's timing headers need.",
                           group=CLIENT)
    keepalive: bool = setting(True, "Reuse connections; without, every request opens its own.",
                              group=CLIENT)
    server_kind: ServerKind = setting(ServerKind.AUTO, "Whose server timings to read: auto, "
                                      "latlab, llamacpp, vllm, sglang, tgi, ollama or openai "
                                      "(none).", group=CLIENT, cli_type=str)
    ca_cert: Path | None = setting(None, "Trust this PEM certificate (or bundle) for an https "
                                   "target: a gateway's self-signed one.", group=CLIENT,
                                   metavar="FILE")
    insecure: bool = setting(False, "Check no certificate of an https target (the handshake "
                             "is still timed).", group=CLIENT)

    @model_validator(mode="after")
    def _tls(self) -> TransportConfig:
        if self.ca_cert is not None and self.insecure:
            raise ValueError("--ca-cert trusts a certificate, --insecure checks none: give one")
        if self.ca_cert is not None and not self.ca_cert.is_file():
            raise ValueError(f"--ca-cert {self.ca_cert}: no such file")
        return self
