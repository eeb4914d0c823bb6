"""A sweep without --url: one embedded engine serves every point, and Ctrl-C stops the sweep
cleanly — the finished points kept, the engine stopped."""

import socket
from pathlib import Path
from urllib.parse import urlparse

import orjson
import pytest
from processes import interrupted

from latlab.records.folder import RunFolder

pytest.importorskip("torch")

TINY = "--model tiny --max-model-len 256 --num-kv-blocks 64 --block-size 8"


def serving(port: int) -> list[str]:
    """Live processes whose command line holds `--port PORT`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z" and any(a == b"--port" and b == str(port).encode()
                                for a, b in zip(cmdline, cmdline[1:])):
            found.append(proc.name)
    return found


def test_ctrl_c_keeps_the_finished_points_and_stops_the_one_engine(tmp_path):
    command = ["sweep", "--serve-args", TINY,
               "--rates", "2,3,4", "--duration", "3", "--prompt-tokens", "16",
               "--output-tokens", "4", "--out", str(tmp_path), "--no-progress"]
    def two_points_started() -> bool:
        return any(tmp_path.glob("*-sweep-engine/*-p01-*/config.json"))

    code, _, err = interrupted(command, two_points_started, "the second point", 240, 0.5)
    assert code == 130, err.decode()
    folder = next(tmp_path.glob("*-sweep-engine"))
    data = orjson.loads((folder / "sweep.json").read_bytes())
    assert data["stop"]["reason"] == "interrupted"
    assert data["points"][0]["asked"] == 2 and not data["points"][0]["interrupted"]
    assert len(data["points"]) < 3
    assert (folder / "sweep.html").is_file() and (folder / "engine.log").is_file()
    configs = [RunFolder.open(p).read_config() for p in folder.iterdir() if p.is_dir()]
    urls = {c.target.url for c in configs}
    assert len(configs) == 2 and len(urls) == 1  # one engine for every point
    assert all(c.bench.serve_args == TINY.split() for c in configs)
    assert data["target"]["embedded"] and data["target"]["engine_ready_s"] > 0
    port = urlparse(urls.pop()).port
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    assert serving(port) == []


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the point
def test_a_ctrl_c_python_swallowed_is_still_remembered():
    """Python can only print a KeyboardInterrupt raised in a `__del__` or a weakref callback;
    the sweep and ab loops ask `pressed()` after each point or round, so it still stops them."""
    import signal

    from latlab.load.target.interrupts import remembered_interrupts

    class Collected:
        def __del__(self):
            signal.getsignal(signal.SIGINT)(signal.SIGINT, None)

    before = signal.getsignal(signal.SIGINT)
    with remembered_interrupts() as pressed:
        assert not pressed()
        Collected()  # its KeyboardInterrupt is swallowed
        assert pressed()
    assert signal.getsignal(signal.SIGINT) is before
