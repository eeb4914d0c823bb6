"""The `latlab ab` a suggestion prints: rounds long enough to hold the requests a verdict
needs, where the run held few (synthetic runs)."""

import shlex

from timelines import timeline, write_run

from latlab.analysis import analyze
from latlab.analysis.findings import Change
from latlab.services.advice_ab import ROUND_REQUESTS, ab_command, round_duration

SMALLER = Change("step_tokens", 512, "llamacpp", "-b 512 -ub 512")


def run(tmp_path, requests: int, duration_s: float):
    records = [timeline(i, i * 1000 * duration_s / requests, tokens=8) for i in range(requests)]
    config = {"bench": {"duration_s": duration_s, "serve_args": "-np 4",
                        "launch": "server --port {port} {args}"},
              "target": {"url": "http://127.0.0.1:1", "launch": "server --port {port} {args}"}}
    return analyze(write_run(tmp_path, records, config=config), diagnosis=False)


def test_a_run_of_few_requests_gets_longer_rounds(tmp_path):
    few = run(tmp_path / "few", 8, 15.0)
    held = int(few.ok.sum())
    assert held < ROUND_REQUESTS
    longer = round_duration(few)
    assert longer is not None and longer * held / 15.0 >= ROUND_REQUESTS and longer % 5 == 0
    words = shlex.split(ab_command(few, SMALLER, ("itl_max", "mean")))
    assert words[words.index("--duration") + 1] == f"{longer:g}"
    assert words[words.index("--decide-on") + 1] == "mean_itl_max"
    assert words[words.index("--b") + 1] == "-np 4 -b 512 -ub 512"


def test_a_run_that_held_enough_keeps_its_length(tmp_path):
    many = run(tmp_path / "many", 60, 15.0)
    assert round_duration(many) is None
    assert "--duration" not in ab_command(many, SMALLER, ("itl_max", "mean"))
