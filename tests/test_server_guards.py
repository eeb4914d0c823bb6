"""Who may call latlab serve: JSON bodies only, no cross-origin pages unless allowed, the API
key from the command line, the environment or a file, with the bearer scheme in any case."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx
import pytest
from engine_server import running_server

from latlab.records.engine import ConfigError
from latlab.server.auth import read_api_key

BODY = b'{"prompt": "x", "max_tokens": 2}'


@pytest.fixture(scope="module")
def server():
    with running_server() as s:
        yield s


@pytest.mark.parametrize("content_type, status", [
    (None, 415), ("text/plain", 415), ("application/x-www-form-urlencoded", 415),
    ("multipart/form-data; boundary=x", 415), ("application/json; charset=utf-8", 200),
    ("Application/JSON", 200),
])
def test_only_json_bodies_are_taken(server, content_type, status):
    headers = {"Content-Type": content_type} if content_type else {}
    for path in ("/v1/completions", "/v1/chat/completions"):
        body = BODY if "chat" not in path else b'{"messages": [{"role": "user", "content": "x"}]}'
        r = httpx.post(server.url + path, content=body, headers=headers)
        assert r.status_code == status, r.text
        if status == 415:
            assert r.json()["error"]["code"] == "unsupported_media_type"


def test_pages_from_other_origins_are_refused(server):
    evil = {"Origin": "http://evil.example", "Content-Type": "application/json"}
    r = httpx.post(server.url + "/v1/completions", content=BODY, headers=evil)
    assert r.status_code == 403 and r.json()["error"]["code"] == "origin_not_allowed"
    assert httpx.get(server.url + "/v1/models", headers=evil).status_code == 403
    assert "access-control-allow-origin" not in r.headers


def test_allow_origin_lets_that_page_in_with_cors():
    app = "http://app.example"
    with running_server(settings={"allow_origins": (app,)}) as s:
        preflight = httpx.options(s.url + "/v1/completions", headers={
            "Origin": app, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, authorization"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == app
        r = httpx.post(s.url + "/v1/completions", content=BODY,
                       headers={"Origin": app, "Content-Type": "application/json"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == app
        other = httpx.post(s.url + "/v1/completions", content=BODY, headers={
            "Origin": "http://evil.example", "Content-Type": "application/json"})
        assert other.status_code == 403


def test_the_bearer_scheme_is_case_insensitive():
    with running_server(api_key="s3cret") as s:
        for header, status in (("Bearer s3cret", 200), ("bearer s3cret", 200),
                               ("BEARER  s3cret", 200), ("Basic s3cret", 401),
                               ("Bearer", 401), ("s3cret", 401), ("bearer wrong", 401)):
            r = httpx.get(s.url + "/v1/models", headers={"Authorization": header})
            assert r.status_code == status, header


def test_the_key_from_the_command_line_the_environment_or_a_file(tmp_path, monkeypatch):
    monkeypatch.delenv("LATLAB_API_KEY", raising=False)
    path = tmp_path / "key"
    path.write_text("  from-a-file \nignored second line\n")
    assert read_api_key(None, path) == "from-a-file"
    assert read_api_key("on-the-command-line", None) == "on-the-command-line"
    assert read_api_key(None, None) is None
    monkeypatch.setenv("LATLAB_API_KEY", "from-env")
    assert read_api_key(None, None) == "from-env"
    monkeypatch.setenv("LATLAB_API_KEY", "")
    with pytest.raises(ConfigError, match="the API key is empty"):
        read_api_key(None, None)


@pytest.mark.parametrize("key, content, message", [
    (None, "", "the API key is empty"),
    (None, None, "cannot read it"),
    ("k", "other", "not both"),
])
def test_a_bad_key_setting_is_one_clear_error(tmp_path, monkeypatch, key, content, message):
    monkeypatch.delenv("LATLAB_API_KEY", raising=False)
    path = tmp_path / "key"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError, match=message):
        read_api_key(key, path)


def serve(args: list[str], env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "latlab", "serve", "--model", "tiny", "--max-model-len", "64",
         "--num-kv-blocks", "16", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1", **env})


def test_serve_takes_the_key_from_latlab_api_key(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = serve(["--port", str(port)], {"LATLAB_API_KEY": "from-env"})
    try:
        assert process.stdout.readline().startswith("latlab serve: ready"), process.stderr
        url = f"http://127.0.0.1:{port}/v1/models"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": "bearer from-env"}).status_code == 200
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_serve_with_an_unreadable_key_file_says_so_in_one_line(tmp_path):
    process = serve(["--api-key-file", str(tmp_path / "missing")], {})
    _, err = process.communicate(timeout=60)
    assert process.returncode == 2
    assert err.strip().splitlines() == [
        f"latlab serve: error: --api-key-file {tmp_path / 'missing'}: cannot read it "
        "(No such file or directory)"]
