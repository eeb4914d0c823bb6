"""The target of a run: whose server it is, its root URL, and command lines with their
secrets hidden."""

from __future__ import annotations

import re
from enum import StrEnum


class ServerKind(StrEnum):
    """Whose server timings to read (`latlab.load.request.server_timing`); `auto` tells them apart."""

    AUTO = "auto"
    LATLAB = "latlab"
    LLAMACPP = "llamacpp"
    VLLM = "vllm"
    SGLANG = "sglang"
    TGI = "tgi"
    OLLAMA = "ollama"
    OPENAI = "openai"  # any other OpenAI-compatible server: the client's view only


SECRETS = ("--api-key",)
_INLINE_SECRET = re.compile(r"(--api-key(?:=|\s+))(\"[^\"]*\"|'[^']*'|\S+)")
HIDDEN = "***"


def redact(argv: list[str] | tuple[str, ...]) -> list[str]:
    """A command line with every secret replaced: `--api-key KEY`, `--api-key=KEY`, and the
    same inside one argument (`--serve-args "--api-key KEY"`). Nothing stored or printed
    holds a secret."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            out.append(HIDDEN)
            hide = False
        elif arg in SECRETS:
            out.append(arg)
            hide = True
        else:
            out.append(_INLINE_SECRET.sub(rf"\g<1>{HIDDEN}", arg))
    return out


def server_root(url: str | None, flag: str = "--url") -> str | None:
    """A server's root URL: `http://HOST:PORT`, also from its OpenAI base URL (`…/v1`)."""
    if url is None:
        return None
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"{flag} {url!r}: expected http://HOST:PORT or https://...")
    root = url.rstrip("/")
    return root[: -len("/v1")] if root.endswith("/v1") else root
