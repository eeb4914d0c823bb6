"""Real gateways in front of an engine on 127.0.0.1, for the tests that need them and for
benchmarks/gateway_hop.py: LiteLLM's proxy (its own venv) and nginx as a plain and a
TLS-terminating reverse proxy (a self-signed certificate made with openssl on the spot).

    with litellm_proxy(engine_url, folder) as url: ...      # None: LiteLLM not installed
    with nginx_proxy(engine_url, folder) as (plain, tls, cert): ...

Neither is installed by `make test`: LiteLLM comes from `python3 -m venv /work/venvs/litellm &&
/work/venvs/litellm/bin/pip install -c constraints.txt 'litellm[proxy]'` ($LATLAB_LITELLM names
another `litellm` binary), nginx from the Debian package. Every process is stopped by its PID.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from latlab.load.target.launch import ServerLaunch, free_port, launched

LITELLM_KEY = "sk-latlab-test"  # the proxy's master key: requests carry it as their bearer


def litellm_binary() -> str | None:
    given = os.environ.get("LATLAB_LITELLM")
    if given:
        return shutil.which(given) or given
    venv = Path("/work/venvs/litellm/bin/litellm")
    return str(venv) if venv.is_file() else shutil.which("litellm")


def nginx_binary() -> str | None:
    return shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).is_file()),
                                         None)


def openssl_binary() -> str | None:
    return shutil.which("openssl")


@contextmanager
def litellm_proxy(engine_url: str, folder: Path, model: str = "default") -> Iterator[str]:
    """LiteLLM's proxy on a free loopback port in front of the OpenAI-compatible engine at
    `engine_url`, serving it as `model` behind LITELLM_KEY; no call leaves the machine (the
    model cost map is the package's own, telemetry off)."""
    binary = litellm_binary()
    if binary is None:
        raise RuntimeError("LiteLLM is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {model}\n"
        "    litellm_params:\n"
        f"      model: openai/{model}\n"
        f"      api_base: {engine_url}/v1\n"
        "      api_key: none\n"
        "general_settings:\n"
        f"  master_key: {LITELLM_KEY}\n"
        "litellm_settings:\n"
        "  telemetry: false\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = ["LITELLM_LOCAL_MODEL_COST_MAP=True", "LITELLM_TELEMETRY=False",
           "DISABLE_SCHEMA_UPDATE=True", "NO_PROXY=*"]
    command = ["env", *env, binary, "--config", str(config), "--host", "127.0.0.1", "--port",
               str(port), "--num_workers", "1"]
    with launched(ServerLaunch(tuple(command), url, f"{url}/health/liveliness", "LiteLLM"),
                  ready_timeout_s=180, log_path=folder / "litellm.log"):
        yield url


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost and its key, made with openssl."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run([openssl_binary() or "openssl", "req", "-x509", "-newkey", "rsa:2048",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key),
                    "-out", str(cert)], check=True, capture_output=True)
    return cert, key


@contextmanager
def nginx_proxy(engine_url: str, folder: Path, buffering: bool = False,
                gzip: bool = False) -> Iterator[tuple[str, str, Path]]:
    """nginx on two free loopback ports in front of `engine_url`: plain HTTP, and HTTPS with
    a self-signed certificate; yields both URLs and the certificate. Responses stream through
    unbuffered (with `buffering`: nginx's default, and the server's `X-Accel-Buffering: no`
    ignored, as for a server that does not send it; with `gzip`, event streams compressed,
    which holds them in gzip's buffers), upstream connections are kept alive."""
    binary = nginx_binary()
    if binary is None:
        raise RuntimeError("nginx is not installed")
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = self_signed(folder)
    plain, tls = free_port(), free_port()
    upstream = engine_url.removeprefix("http://")
    temp = {name: folder / name for name in ("body", "proxy", "fastcgi", "uwsgi", "scgi")}
    (folder / "nginx.conf").write_text(f"""
worker_processes 1;
pid {folder}/nginx.pid;
error_log {folder}/error.log warn;
daemon off;
events {{ worker_connections 512; }}
http {{
    access_log off;
    {'gzip on; gzip_types text/event-stream; gzip_min_length 0;' if gzip else ''}
    client_body_temp_path {temp['body']};
    proxy_temp_path {temp['proxy']};
    fastcgi_temp_path {temp['fastcgi']};
    uwsgi_temp_path {temp['uwsgi']};
    scgi_temp_path {temp['scgi']};
    upstream engine {{ server {upstream}; keepalive 32; }}
    server {{
        listen 127.0.0.1:{plain};
        listen 127.0.0.1:{tls} ssl;
        ssl_certificate {cert};
        ssl_certificate_key {key};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering {'on' if buffering else 'off'};
            {'proxy_ignore_headers X-Accel-Buffering;' if buffering else ''}
            proxy_read_timeout 300s;
        }}
    }}
}}
""")
    url = f"http://127.0.0.1:{plain}"
    command = [binary, "-p", str(folder), "-c", str(folder / "nginx.conf")]
    with launched(ServerLaunch(tuple(command), url, f"{url}/v1/models", "nginx"),
                  ready_timeout_s=30,
                  log_path=folder / "nginx.log"):
        yield url, f"https://127.0.0.1:{tls}", cert
