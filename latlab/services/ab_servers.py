"""The servers `latlab ab` starts for its sides (an embedded latlab serve, or `--launch`).

With `--fresh-servers every` (the default) each A/B pair of rounds runs on a new server
process a side: what one process builds up and keeps (a cache, an allocator's state, a thread
count it settled on, the cores it was placed on) then differs from pair to pair, where the
paired comparison sees it as noise, instead of lasting through every round of one side, where
alternating the rounds cannot cancel it and it would be taken for the setting's. The two
sides' servers start in parallel, each gets a few warm-up requests (not recorded, not
compared), and the previous pair's are stopped first: never two pairs' servers at once.

    with SideServers(configs, folder, fresh=True, err=err) as servers:
        start = servers.ready_for(pair)  # the start number the pair's rounds run on
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from latlab.load.generator import run_load
from latlab.load.target.launch import (
    ServerProcess,
    ready_timeout,
    spawn_server,
    target_launch,
)
from latlab.records.ab import SIDES
from latlab.records.bench import BenchConfig

WARMUP_REQUESTS = 4  # a new server's first requests: lazy imports, first allocations
WARMUPS = "server-warm-ups"  # the ab folder's subfolder for their run folders


class SideServers:
    """The servers of the sides ab starts (`configs`' sides without a URL; their `url` is set
    to each started server's), one start a pair (`fresh`) or one for all pairs."""

    def __init__(self, configs: dict[str, BenchConfig], folder: Path, *, fresh: bool,
                 err: Console | None = None) -> None:
        self.configs = {side: c for side, c in configs.items() if c.url is None}
        self.folder = folder
        self.fresh = fresh
        self.err = err
        self.running: list[ServerProcess] = []
        self.start: int | None = None  # the servers now running: their start number

    @property
    def kept(self) -> bool:
        """Whether some side runs every round on one server process (not fresh, or a URL)."""
        return not self.fresh or len(self.configs) < len(SIDES)

    def ready_for(self, pair: int) -> int | None:
        """The servers for pair `pair` (1 on, the warm-up rounds' too) running and warmed up:
        the previous pair's stopped and new ones started when fresh; their start number, or
        None when ab starts no server."""
        if not self.configs:
            return None
        start = pair if self.fresh else 1
        if start != self.start:
            self.stop()
            self._start(start)
        return start

    def _start(self, start: int) -> None:
        """Both sides' servers spawned at once, then waited for, then warmed up a side at a
        time (A's first), so their start-up overlaps and their warm-ups do not."""
        if self.err is not None:
            self.err.print(f"starting the servers (start {start})…", style="dim")
        for side, config in self.configs.items():
            name = f"{side}'s {'server' if config.launch else 'latlab serve'}"
            log = self.folder / f"{'server' if config.launch else 'engine'}-{side}-{start}.log"
            self.running.append(spawn_server(target_launch(config, name=name), log_path=log))
        for server, config in zip(self.running, self.configs.values()):
            server.wait_ready(ready_timeout(config))
            config.url = server.url
        self.start = start
        for side, config in self.configs.items():
            warm_up(config, self.folder / WARMUPS, f"warm-up-{side}-{start}")

    def stop(self) -> None:
        """Stop every running server (each by its process group's PID)."""
        while self.running:
            self.running.pop().stop()
        self.start = None

    def __enter__(self) -> SideServers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def warm_up(config: BenchConfig, out: Path, name: str) -> None:
    """A few requests to a new server, its side's workload at its concurrency, neither
    compared nor registered in the store (their run folder is kept under `out`); a failed
    one is what a warm-up is for."""
    run_load(config.model_copy(update={
        "requests": WARMUP_REQUESTS, "duration_s": None, "warmup_s": 0.0, "cooldown_s": 0.0,
        "out": out, "name": name}))
