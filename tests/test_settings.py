"""Settings declared once: options derived from the configs, grouped help, `--config` reruns a
run, named workloads, and a command takes no option it ignores."""

import re

import pytest
import yaml
from sse_server import DONE, Server, Step, completion, stream, usage_only
from typer.testing import CliRunner

from latlab.cli import app
from latlab.commands.options import parse_args
from latlab.records.bench import BenchConfig
from latlab.records.engine import EngineConfig, ServeConfig
from latlab.records.folder import RunFolder
from latlab.records.settings import option, specs

STEPS = [Step(0.002, completion("a", {"prompt_tokens": 8, "completion_tokens": 1})),
         Step(0, completion("b", {"prompt_tokens": 8, "completion_tokens": 2})),
         Step(0, usage_only(8, 2)), Step(0, DONE)]


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def runs(root):
    return sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.name)


def test_help_is_grouped_target_and_load_first():
    text = invoke("bench", "--help").output
    sections = re.findall(r"^([A-Z][A-Za-z /]+):$", text, re.M)
    assert sections[:6] == ["Target", "Workload", "Sessions and agents", "Load",
                            "Trace replay", "When to stop"], sections
    assert sections.index("Client") > sections.index("Load")
    assert "--no-ignore-eos" in text and "--workload" in text and "--config" in text


def test_a_command_takes_no_option_it_ignores():
    """coldstart probes one request at a time without streaming options; predict sends
    nothing; ab's sides name their own targets."""
    for command, flag in (("coldstart", "--stream"), ("coldstart", "--keepalive"),
                          ("coldstart", "--server-kind"), ("coldstart", "--turns"),
                          ("predict", "--url"), ("predict", "--workers"),
                          ("predict", "--prompts"), ("ab", "--url"),
                          ("ab", "--serve-args"), ("calibrate", "--workload"),
                          ("sweep", "--rate"), ("sweep", "--users")):
        result = invoke(command, flag, "x", "--help")
        assert result.exit_code == 2 and "No such option" in result.output, (command, flag)


def test_every_engine_setting_is_one_option_of_serve_and_of_serve_args():
    serve = invoke("serve", "--help").output
    for spec in specs(EngineConfig):
        assert spec.flag in serve, spec.flag
    parsed = parse_args(ServeConfig, ["--max-num-seqs", "8", "--no-chunked-prefill"],
                        "--serve-args")
    assert parsed.engine.max_num_seqs == 8 and not parsed.engine.enable_chunked_prefill
    assert parsed.engine.kv_cache_mib == EngineConfig().kv_cache_mib  # the one default


def test_flags_are_unique_and_each_setting_documents_itself():
    for model in (BenchConfig, ServeConfig):
        flags = [spec.flag for spec in specs(model)]
        assert len(flags) == len(set(flags))
        assert all(spec.help for spec in specs(model))
    assert all(option(f) is None or f.description for f in BenchConfig.model_fields.values())


def test_config_reruns_a_run_and_flags_override_it(tmp_path):
    with Server(stream(STEPS)) as server:
        first = invoke("bench", "--url", server.url, "--requests", 6, "--rate", 40,
                       "--prompt-tokens", "fixed:16", "--output-tokens", 2, "--seed", 3,
                       "--tenant", "a:2", "--out", tmp_path / "a", "--no-progress")
        assert first.exit_code == 0, first.output
        (run,) = runs(tmp_path / "a")
        again = invoke("bench", "--config", run, "--out", tmp_path / "b", "--no-progress")
        assert again.exit_code == 0, again.output
        over = invoke("bench", "--config", run / "config.json", "--requests", 4, "--users", 2,
                      "--out", tmp_path / "c", "--no-progress")
        assert over.exit_code == 0, over.output
        same = invoke("bench", "--config", run, "--prompts", run, "--out", tmp_path / "d",
                      "--no-progress")
        assert same.exit_code == 0, same.output
    a = RunFolder.open(run).read_config().bench
    b = RunFolder.open(runs(tmp_path / "b")[0]).read_config().bench
    c = RunFolder.open(runs(tmp_path / "c")[0]).read_config().bench
    d = RunFolder.open(runs(tmp_path / "d")[0]).read_config().bench
    fresh = {"out": True, "workload": {"prompt_salt"}}
    assert b.model_dump(exclude=fresh) == a.model_dump(exclude=fresh)
    assert b.workload.prompt_salt != a.workload.prompt_salt  # a rerun's prompts are fresh...
    assert d.workload.prompt_salt == a.workload.prompt_salt  # ... unless asked for again
    assert (c.requests, c.arrivals.process, c.arrivals.users) == (4, "closed", 2)
    assert (c.workload.prompt_tokens, c.workload.seed, c.workload.tenants) == (
        a.workload.prompt_tokens, 3, {"a": 2.0})


def test_a_yaml_config_and_a_named_workload(tmp_path):
    path = tmp_path / "load.yaml"
    path.write_text(yaml.safe_dump({"workload": {"prompt_tokens": "fixed:32"},
                                    "arrivals": {"rate": 2.0}, "requests": 5}))
    with Server(stream(STEPS)) as server:
        result = invoke("bench", "--url", server.url, "--workload", "chat", "--config", path,
                        "--out", tmp_path / "runs", "--no-progress")
        bodies = [r["body"] for r in server.received]
    assert result.exit_code == 0, result.output
    bench = RunFolder.open(runs(tmp_path / "runs")[0]).read_config().bench
    assert bench.workload.api == "chat" and str(bench.workload.prompt_tokens) == "fixed:32"
    assert str(bench.workload.output_tokens) == "lognormal:256,128"  # the workload's
    assert bench.arrivals.process == "poisson" and bench.requests == 5
    assert all("messages" in b for b in bodies)


@pytest.mark.parametrize("args, fragment", [
    (["--workload", "nope"], "--workload 'nope': expected one of"),
    (["--config", "missing.yaml"], "--config missing.yaml"),
    (["--config", "BAD"], "not YAML or JSON"),
])
def test_bad_config_sources_are_one_line(tmp_path, args, fragment):
    if "BAD" in args:
        (tmp_path / "bad.yaml").write_text("a: [1, 2\n")
        args = ["--config", str(tmp_path / "bad.yaml")]
        fragment = "not YAML or JSON"
    result = invoke("bench", "--url", "http://127.0.0.1:9", *args)
    assert result.exit_code == 2 and fragment in result.output, result.output
    assert "Traceback" not in result.output


def test_named_workloads_are_listed_and_each_builds():
    listed = invoke("bench", "--workload", "list").output.split("\n")
    names = [line.split()[0] for line in listed if line.strip()]
    assert {"chat", "rag", "code", "agent"} <= set(names)
    from latlab.commands.config_files import read_workload

    for name in names:
        BenchConfig.model_validate(read_workload(name, BenchConfig))


def test_the_catalog_is_what_every_list_reads():
    """Each table, chart, SLO parser and export iterates the metric catalog."""
    from latlab.analysis.compare import LATENCY_METRICS, RATES
    from latlab.metrics.summary import FAILURE_ADJUSTED
    from latlab.records.catalog import CATALOG, formulas, metrics
    from latlab.records.slo import SLO_METRICS, parse_slo
    from latlab.report.console import SUMMARY_ROWS
    from latlab.report.figures import SLO_PANEL

    assert SLO_METRICS == metrics(slo=True) and set(SLO_PANEL) == set(SLO_METRICS)
    assert [name for name, _ in SUMMARY_ROWS] == list(metrics(summary=True))
    assert set(LATENCY_METRICS) | set(RATES) == set(metrics(compared=True))
    assert set(FAILURE_ADJUSTED) <= set(SLO_METRICS)
    assert set(formulas()) >= set(CATALOG)
    for name in SLO_METRICS:
        assert parse_slo(f"{name}=10ms") == (name, 10.0)
    with pytest.raises(ValueError, match="unknown metric"):
        parse_slo("lateness=10ms")  # a metric, but not one an SLO may bound
