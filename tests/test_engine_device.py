"""The engine's device: every tensor placed on it, the token ids to the host once per step, and
the static decode path checked eagerly on the CPU; on a machine with a CUDA GPU, the graphs
captured and replayed there (`scripts/gpu_check.sh` runs this file on one)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from latlab.engine import intra_op
from latlab.engine.config import PRESETS
from latlab.engine.cuda_graphs import StaticDecode, capture_sizes, capture_widths, padded
from latlab.engine.device import resolve_device
from latlab.engine.engine import LLMEngine
from latlab.engine.model_runner import ModelRunner
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import ConfigError, EngineConfig

GREEDY = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=12, temperature=0.8, top_p=0.9, top_k=50, seed=5)
BASE = dict(model="tiny", max_model_len=128, block_size=4, num_kv_blocks=96, max_num_seqs=6,
            max_num_batched_tokens=32, warmup=False, device="cpu")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
ON_CUDA = {**BASE, "device": "cuda"}


def prompts(lengths: list[int]) -> list[list[int]]:
    g = torch.Generator().manual_seed(3)
    return [torch.randint(0, 8192, (n,), generator=g).tolist() for n in lengths]


PROMPTS = prompts([5, 20, 3, 11, 1, 40, 9])  # more than max_num_seqs: decodes of 1 to 6 seqs


def outputs(engine: LLMEngine, params: SamplingParams = GREEDY) -> list[list[int]]:
    return [s.output_token_ids for s in engine.generate(PROMPTS, params)]


@pytest.fixture(scope="module")
def reference() -> dict[str, list[list[int]]]:
    engine = LLMEngine(EngineConfig(**BASE))
    return {"greedy": outputs(engine), "sampled": outputs(engine, SAMPLED)}


def test_auto_is_cuda_when_torch_sees_a_gpu_else_the_cpu(monkeypatch):
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    assert LLMEngine(EngineConfig(**{**BASE, "device": "auto"})).device.type == expected
    assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")


def test_int8_is_refused_on_cuda_and_unknown_devices_are_refused(monkeypatch):
    with pytest.raises(ConfigError, match="--device must be one of auto, cpu, cuda"):
        resolve_device("tpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError, match="--quantization int8 runs on the CPU only"):
        resolve_device("cuda", "int8")
    assert resolve_device("cpu", "int8").type == "cpu"


@no_cuda
def test_serve_with_device_cuda_and_no_gpu_says_so_in_one_line():
    process = subprocess.run([sys.executable, "-m", "latlab", "serve", "--model", "tiny",
                              "--device", "cuda"], capture_output=True, text=True, timeout=120)
    assert process.returncode == 2
    assert process.stderr.strip().splitlines() == [
        "latlab serve: error: --device cuda: no CUDA GPU is available "
        f"(torch {torch.__version__}, a CPU-only build)"]


@pytest.mark.parametrize("options", [{}, {"speculative_method": "ngram"}])
def test_no_engine_tensor_is_made_on_the_default_device(reference, options):
    """With torch's default device set to `meta`, a tensor made without naming its device
    would be a meta tensor, and the engine's output would be lost."""
    with torch.device("meta"):
        engine = LLMEngine(EngineConfig(**BASE, **options))
        assert outputs(engine) == reference["greedy"]
        assert outputs(engine, SAMPLED) == reference["sampled"]


def test_a_step_copies_token_ids_to_the_host_once(monkeypatch):
    engine = LLMEngine(EngineConfig(**BASE, speculative_method="ngram"))
    mixed = [SamplingParams(max_tokens=12, temperature=t, ignore_eos=True) for t in (0, 0.7)]
    for i, (prompt, params) in enumerate(zip(PROMPTS, mixed * 4)):
        engine.add_request(str(i), prompt * 3, params)  # repeats: the n-gram proposer drafts
    copies = []
    tolist = torch.Tensor.tolist
    monkeypatch.setattr(torch.Tensor, "tolist", lambda t: copies.append(t.numel()) or tolist(t))
    steps = with_drafts = 0
    while engine.has_unfinished():
        drafted = any(s.spec_token_ids for s in engine.scheduler.running)
        copies.clear()
        if engine.step():
            assert len(copies) == 1
            steps, with_drafts = steps + 1, with_drafts + drafted
    assert steps > 1 and with_drafts > 0


def test_padded_sizes_and_widths():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 32, 48, 64]
    assert capture_sizes(6) == [1, 2, 4, 6]
    assert capture_sizes(1) == [1]
    assert capture_widths(128) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert capture_widths(5) == [1, 2, 4, 5]
    assert [padded(n, [1, 2, 4, 6]) for n in (1, 3, 5, 6)] == [1, 4, 6, 6]


def static_engine() -> tuple[LLMEngine, list[int]]:
    """An engine whose decode steps go through `StaticDecode` eagerly (no graphs on a CPU),
    and the batch sizes it ran."""
    engine = LLMEngine(EngineConfig(**BASE))
    runner = engine.runner
    engine.runner = ModelRunner(runner.model, runner.sampler, engine.block_manager.num_blocks,
                                BASE["block_size"], static_decode=True,
                                max_num_seqs=BASE["max_num_seqs"],
                                max_model_len=BASE["max_model_len"])
    static, sizes = engine.runner.static_decode, []
    run = static.run
    static.run = lambda seqs, inputs: sizes.append(len(seqs)) or run(seqs, inputs)
    return engine, sizes


def staggered(engine: LLMEngine) -> list[list[int]]:
    """Requests that end one after another, so that decode batches shrink by one."""
    seqs = [engine.add_request(f"s{i}", p, SamplingParams(max_tokens=3 * i + 2, temperature=0,
                                                          ignore_eos=True))
            for i, p in enumerate(PROMPTS)]
    while engine.has_unfinished():
        engine.step()
    return [s.output_token_ids for s in seqs]


def test_the_static_decode_path_gives_the_eager_output(reference):
    engine, sizes = static_engine()
    assert outputs(engine) == reference["greedy"]
    assert outputs(engine, SAMPLED) == reference["sampled"]
    assert staggered(engine) == staggered(LLMEngine(EngineConfig(**BASE)))
    assert not engine.runner.static_decode.graphs
    assert set(range(1, 7)) <= set(sizes)  # 3 and 5 padded to 4 and 6 rows


def test_padding_rows_write_only_the_scratch_block():
    engine, sizes = static_engine()
    seqs = [engine.add_request(str(i), p, GREEDY) for i, p in enumerate(PROMPTS[:3])]
    while not all(s.is_decoding for s in seqs):
        engine.step()
    cache = engine.runner.model.layers[0].self_attn.k_cache
    before = cache.clone()
    engine.step()
    assert sizes == [3]  # padded to 4: one padding row
    written = (cache != before).flatten(2).any(dim=2).any(dim=0).nonzero().flatten().tolist()
    last_blocks = {s.block_table[(s.num_computed_tokens - 1) // BASE["block_size"]]
                   for s in seqs}
    assert set(written) == last_blocks | {engine.block_manager.num_blocks}


def test_capturing_graphs_needs_cuda():
    engine = LLMEngine(EngineConfig(**BASE))
    static = StaticDecode(engine.runner.model, 4, 8, 4, scratch_block=0)
    with pytest.raises(RuntimeError, match="CUDA graphs need the model on a CUDA device"):
        static.capture()



def test_big_steps_split_over_every_thread_and_one_thread_never_splits():
    default = PRESETS["default"]
    small = intra_op.IntraOpThreads(2, default.hidden_size, default.intermediate_size)
    assert small.min_tokens == 43
    assert [small.for_tokens(n) for n in (43, 512)] == [2, 2]
    assert intra_op.IntraOpThreads(4, 2048, 8192).for_tokens(1) == 4  # a 1B Llama's MLP
    assert intra_op.IntraOpThreads(1, 384, 1024).for_tokens(16) == 1
    assert small.choices == {}  # nothing to learn for those


class StepClock:
    """A step's time as the threads it ran on make it: `cost[threads]` ns."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now

    def steps(self, threads: intra_op.IntraOpThreads, cost: dict[int, int], n: int,
              tokens: int = 16) -> list[int]:
        chosen = []
        try:
            for _ in range(n):
                threads.use(tokens)
                chosen.append(torch.get_num_threads())
                self.now += cost[chosen[-1]]
                threads.done()
        finally:
            torch.set_num_threads(1)
        return chosen


def test_small_steps_run_on_whichever_choice_was_faster_and_trials_get_rarer():
    clock = StepClock()
    threads = intra_op.IntraOpThreads(2, 384, 1024, clock=clock)
    calm = clock.steps(threads, {1: 10_000, 2: 6_000}, 300)
    assert calm[:6] == [1, 2, 1, 2, 1, 2]  # each choice timed first
    assert calm[-100:].count(2) >= 90  # then the faster, one thread only on trial
    threads = intra_op.IntraOpThreads(2, 384, 1024, clock=clock)
    busy = clock.steps(threads, {1: 10_000, 2: 100_000}, 3000)
    assert busy[:100].count(2) > busy[-1000:].count(2)
    assert busy[-1000:].count(2) <= 8  # a trial of 4 steps at most every 1024 steps
    # the host calms down: the split comes back at the next trial
    after = clock.steps(threads, {1: 10_000, 2: 6_000}, 1200)
    assert after[-100:].count(2) >= 90
    assert set(threads.choices) == {5}  # 16 tokens: the bucket of 16 to 31


def test_steps_learn_their_threads_from_their_own_times_in_the_engine(monkeypatch):
    monkeypatch.setattr(intra_op, "PARALLEL_MIN_MACS", 16 * 64 * 128)  # 16 tokens of tiny
    engine = LLMEngine(EngineConfig(**BASE, threads=2))
    model, seen = engine.runner.model, []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda ids, *rest: seen.append(
        (len(ids), torch.get_num_threads())) or forward(ids, *rest))
    try:
        engine.generate(prompts([20, 3]), SamplingParams(max_tokens=8, temperature=0.0,
                                                         ignore_eos=True))
    finally:
        torch.set_num_threads(1)
    assert seen[0] == (23, 2)  # the prefill: big enough for both threads
    assert seen[1:7] == [(2, 1), (2, 2)] * 3  # decodes: each choice timed in turn
    # the 7th decode runs on whichever was faster in these real timings (either, on a busy host)
    assert sorted(engine.runner.threads.choices[2].samples.values()) == [3, 4]


@cuda
def test_on_cuda_graph_replays_give_the_eager_output(monkeypatch):
    """Greedy and seeded outputs token for token, batches shrinking through padded sizes, and
    every tensor placed on the GPU (none made on the default device, `meta` here)."""
    eager = LLMEngine(EngineConfig(**ON_CUDA, enforce_eager=True))
    assert eager.runner.static_decode is None
    expected = [outputs(eager), outputs(eager, SAMPLED), staggered(eager)]
    with torch.device("meta"):
        engine = LLMEngine(EngineConfig(**ON_CUDA))
    static = engine.runner.static_decode
    assert set(static.graphs) == {(s, w) for s in static.sizes for w in static.widths}
    replays = []
    replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay",
                        lambda graph: replays.append(graph) or replay(graph))
    with torch.device("meta"):
        assert [outputs(engine), outputs(engine, SAMPLED), staggered(engine)] == expected
    assert len(set(map(id, replays))) > 1  # more than one (size, width) graph replayed


@cuda
def test_on_cuda_padding_rows_of_a_replay_write_only_the_scratch_block():
    engine = LLMEngine(EngineConfig(**ON_CUDA))
    seqs = [engine.add_request(str(i), p, GREEDY) for i, p in enumerate(PROMPTS[:3])]
    while not all(s.is_decoding for s in seqs):
        engine.step()
    cache = engine.runner.model.layers[0].self_attn.k_cache
    before = cache.clone()
    engine.step()  # 3 sequences replay the graph of 4 rows
    written = (cache != before).flatten(2).any(dim=2).any(dim=0).nonzero().flatten().tolist()
    last_blocks = {s.block_table[(s.num_computed_tokens - 1) // BASE["block_size"]]
                   for s in seqs}
    assert set(written) == last_blocks | {engine.block_manager.num_blocks}
