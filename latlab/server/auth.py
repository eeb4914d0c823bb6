"""The API key: where `latlab serve` reads it from, and the `Authorization` check on /v1.

The key can come from `--api-key` (visible to every user in `ps`), from `LATLAB_API_KEY`
or from `--api-key-file` (its first line). /health, /ready, /metrics and /openapi.json stay
open: they carry no prompt or output, only counts and timings.
"""

from __future__ import annotations

import hmac
import os
from pathlib import Path

from latlab.records.engine import ConfigError
from latlab.server.schemas import ApiError

ENV_VAR = "LATLAB_API_KEY"


def read_api_key(key: str | None, key_file: Path | None) -> str | None:
    """The key from --api-key (else LATLAB_API_KEY) or --api-key-file, not both; None: no
    key. An empty one is an error (an unset secret), never "no key"."""
    if key is None:
        key = os.environ.get(ENV_VAR)
    if key is not None and key_file is not None:
        raise ConfigError(f"give --api-key (or {ENV_VAR}) or --api-key-file, not both")
    if key_file is not None:
        try:
            lines = key_file.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--api-key-file {key_file}: cannot read it "
                              f"({getattr(e, 'strerror', None) or e})") from None
        key = lines[0].strip() if lines else ""
        where = f"--api-key-file {key_file}"
    else:
        where = f"--api-key (or {ENV_VAR})"
    if key is not None and not key.strip():
        raise ConfigError(f"{where}: the API key is empty")
    return key


def check_bearer(authorization: str, key: str) -> None:
    """Raise 401 unless `authorization` is `Bearer <key>` (the scheme in any case)."""
    scheme, _, given = authorization.strip().partition(" ")
    matches = hmac.compare_digest(given.strip().encode(), key.encode())
    if scheme.lower() != "bearer" or not matches:
        raise ApiError(401, "a valid API key is required: Authorization: Bearer <key>",
                       type="authentication_error", code="invalid_api_key")
