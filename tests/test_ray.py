"""`--ray`: the load as Ray actors, against a loopback server, on a local Ray cluster.

One module-scoped cluster (two CPUs, shut down at the end) serves every test here: Ray takes
seconds to start. A run with actors must look like a plain run (the same records, schedule
and summary), plus each record's node and each node's clock offset; a worker whose actor dies
keeps its finished requests and records those it had in flight.
"""

import os
import sys
import threading
import time

import pytest
from sse_server import DONE, Server, Step, completion, stream, usage_only

from latlab.load import BenchError
from latlab.records.arrivals import ArrivalConfig
from latlab.records.bench import BenchConfig
from latlab.records.lengths import LengthDistribution
from latlab.records.timeline import Outcome
from latlab.records.workload import WorkloadConfig
from latlab.services.bench import run_bench

# Ray's processes talk over loopback only (by default they use the machine's address): Ray
# reads this when imported, in this process and in those it starts.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
ray = pytest.importorskip("ray")
pytestmark = pytest.mark.xdist_group("ray")  # one worker, one cluster (`-n`: see pyproject)

SMALL = WorkloadConfig(prompt_tokens=LengthDistribution(kind="fixed", a=8),
                       output_tokens=LengthDistribution(kind="fixed", a=3))


def three_tokens(gap_s: float) -> list[Step]:
    return [Step(0.0, completion("a", {"prompt_tokens": 8, "completion_tokens": 1})),
            Step(gap_s, completion("b", {"prompt_tokens": 8, "completion_tokens": 2})),
            Step(gap_s, completion("c", {"prompt_tokens": 8, "completion_tokens": 3})),
            Step(0, usage_only(8, 3, {"queue": 0.1, "total": 5.0})), Step(0, DONE)]


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield
    finally:
        ray.shutdown()


def config(url, tmp_path, **kw) -> BenchConfig:
    return BenchConfig(**(dict(url=url, workload=SMALL, out=tmp_path, duration_s=None,
                               requests=40, workers=2,
                               arrivals=ArrivalConfig(process="constant", rate=80.0)) | kw))


def populated(obj) -> set[str]:
    return {k for k, v in obj.to_json().items() if v not in (None, [], {})}


def test_the_cluster_stays_on_loopback(cluster):
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}


def test_actors_run_a_plain_runs_schedule_and_records(cluster, tmp_path):
    with Server(stream(three_tokens(0.002))) as server:
        plain = run_bench(config(server.url, tmp_path / "plain"))
        spread = run_bench(config(server.url, tmp_path / "ray", ray="auto"))
    assert not spread.failed and spread.message is None
    runs = {}
    for name, result in (("plain", plain), ("ray", spread)):
        cfg = result.run.read_config()
        records = sorted(result.run.read_records(), key=lambda r: r.index)
        runs[name] = (cfg, records, result.summary)
    (plain_cfg, plain_records, plain_summary), (cfg, records, summary) = runs["plain"], runs["ray"]
    assert [r.index for r in records] == [r.index for r in plain_records] == list(range(40))
    assert [r.worker for r in records] == [r.index % 2 for r in records]
    # one schedule, in the driver's time base
    assert ([r.scheduled_ns - cfg.clock.t0_ns for r in records]
            == [r.scheduled_ns - plain_cfg.clock.t0_ns for r in plain_records])
    assert all(r.ok and r.sent_ns >= r.scheduled_ns and r.done_ns > r.sent_ns for r in records)
    # the same fields measured, plus the node
    assert {f for r in records for f in populated(r)} == (
        {f for r in plain_records for f in populated(r)} | {"node"})
    (node,) = cfg.ray.nodes
    assert {r.node for r in records} == {node.node} and plain_cfg.ray is None
    assert node.workers == [0, 1] and not node.lost
    # one machine: the true offset is 0, which the estimate's bound must hold
    assert abs(node.offset_ns) <= node.uncertainty_ns and node.uncertainty_ns > 0
    assert abs(node.offset_after_ns) <= node.uncertainty_after_ns
    # the same summary, from the same kind of records
    assert set(summary.model_dump(exclude_none=True)) == set(
        plain_summary.model_dump(exclude_none=True))
    assert summary.requests == summary.ok == plain_summary.ok == 40
    assert summary.client.workers == 2 and len(summary.client.cpu_percent.per_process) == 2


def test_a_lost_worker_keeps_its_finished_requests(cluster, tmp_path):
    runs = tmp_path / "runs"
    results = []
    with Server(stream(three_tokens(0.1))) as server:
        bench = threading.Thread(target=lambda: results.append(run_bench(config(
            server.url, runs, requests=None, duration_s=8.0, ray="auto",
            arrivals=ArrivalConfig(process="constant", rate=20.0)))))
        bench.start()
        try:
            victim = None
            deadline = time.monotonic() + 60
            while victim is None and time.monotonic() < deadline and bench.is_alive():
                names = [n for n in ray.util.list_named_actors() if n.endswith("-worker-1")]
                done = [p for p in runs.glob("*/requests.jsonl")
                        if b'"worker":1,' in p.read_bytes()]  # worker 1 finished one
                if names and done:
                    victim = names[0]
                time.sleep(0.05)
            assert victim is not None, "the run did not get going"
            ray.kill(ray.get_actor(victim))
        finally:
            bench.join(60)
    (result,) = results
    records = result.run.read_records()
    lost = [r for r in records if r.worker == 1 and r.outcome == Outcome.CLIENT_ERROR]
    kept = [r for r in records if r.worker == 1 and r.ok]
    assert kept and lost
    assert all("was lost mid-request" in r.error and r.node for r in lost)
    assert any(r.worker == 0 and r.ok and r.scheduled_ns > max(x.scheduled_ns for x in lost)
               for r in records)  # the other worker went on
    assert result.failed and "worker 1 on node" in result.message
    assert any("worker 1 on node" in w for w in result.summary.warnings)


def test_without_ray_installed_the_run_does_not_start(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as if not installed
    with pytest.raises(BenchError, match=r"--ray needs Ray: pip install 'latlab\[ray\]'"):
        run_bench(config("http://127.0.0.1:9", tmp_path, ray="auto"))
    assert not list(tmp_path.iterdir())  # no run folder, no engine
