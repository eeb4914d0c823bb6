"""TLS to the target: whose certificates to trust (`--ca-cert FILE`: a gateway's own, a
self-signed one), or none checked (`--insecure`). One context for every request latlab sends
to the target: the load, the discovery, the probe, the scrape."""

from __future__ import annotations

import ssl

from latlab.load import BenchError


def ssl_context(ca_cert: str | None = None, insecure: bool = False) -> ssl.SSLContext | None:
    """The context for HTTPS to the target (None: the system's trust store, checked)."""
    if insecure:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        return context
    if ca_cert is None:
        return None
    try:
        return ssl.create_default_context(cafile=ca_cert)
    except (OSError, ssl.SSLError) as e:
        raise BenchError(f"--ca-cert {ca_cert}: not a PEM certificate "
                         f"({getattr(e, 'strerror', None) or e})") from None


def for_aiohttp(context: ssl.SSLContext | None) -> ssl.SSLContext | bool:
    """What aiohttp's `ssl=` takes for `context` (True: its default, checked)."""
    return context if context is not None else True
