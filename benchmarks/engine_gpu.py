"""The engine on a GPU (or the CPU): decode steps against the memory roofline, and output
tokens/s against Hugging Face transformers' `generate`, on the same weights in one process.

    python benchmarks/engine_gpu.py                    # a 1B Llama shape in bf16, --device auto
    python benchmarks/engine_gpu.py --device cpu --shape default --dtype float32 \\
        --batches 1 8 --output 32 --steps 20 --copy-mib 256   # the small check on a CPU

* Bandwidth: the best of `--rounds` device-to-device copies of `--copy-mib` MiB, counting
  the bytes read and written, measured in this run.
* Roofline of a decode step: the bytes it must read at least (every weight once and the KV
  cache of every sequence's context) over that bandwidth.
* Decode step time: the median of `--steps` whole `LLMEngine.step()` calls while `batch`
  sequences of 128-token prompts decode greedily (`engine_step.decode_steps`), for each of
  `--batches`; on CUDA three ways: with CUDA graphs and the engine's default attention (the
  Triton kernel reading the paged KV in place, where triton is installed), with graphs and
  `--attention gather`, and with `enforce_eager`. A mode reads `graphs/triton` and so on.
* Decode attention of one layer (`engine_attention.py`): the gather against the Triton
  kernel, at `--attention-batch`.
* Output tokens/s: `batch` prompts of 128 random tokens, `--output` tokens each
  (prefill included), through `LLMEngine.generate` and through transformers'
  `LlamaForCausalLM.generate` (eager PyTorch: no compile, its default dynamic KV cache and
  attention), loaded from the same checkpoint folder; greedy both, and whether their first
  tokens agree is printed (the check that both run the same model).

Shapes: `1b` is Llama 3.2 1B's (hidden 2048, 16 layers, 32 query / 8 KV heads, MLP 8192,
tied embeddings) with the bundled 8192-token vocabulary: 0.99B parameters; `tiny` and
`default` are the engine's presets. Weights are random (seed 0), written once to a temporary
checkpoint folder that both engines load.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time

import torch
from engine_attention import compare as compare_attention
from engine_step import PROMPT_TOKENS, decode_steps

from latlab.engine.config import PRESETS, ModelConfig
from latlab.engine.device import resolve_device
from latlab.engine.engine import LLMEngine
from latlab.engine.loader import LoadedModel, save_checkpoint
from latlab.engine.model import CausalLM
from latlab.engine.sampling_params import SamplingParams
from latlab.records.engine import EngineConfig
from latlab.tokenizer import Tokenizer

SHAPES = {**PRESETS, "1b": ModelConfig(
    vocab_size=8192, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
    num_kv_heads=8, head_dim=64, max_position_embeddings=4096, rope_theta=500000.0)}
AGREE_TOKENS = 8  # greedy tokens compared between the engine and transformers


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bandwidth(device: torch.device, mib: int, rounds: int) -> float:
    """Bytes per second of the best of `rounds` copies (read + write) of `mib` MiB."""
    src = torch.ones(mib << 20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(rounds + 1):  # the first one warms up
        synchronize(device)
        start = time.perf_counter()
        dst.copy_(src)
        synchronize(device)
        best = min(best, time.perf_counter() - start)
    return 2 * src.numel() / best


def prompts(n: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(n)
    return [torch.randint(16, vocab, (PROMPT_TOKENS,), generator=g).tolist() for _ in range(n)]


def engine_generate(engine: LLMEngine, batch: list[list[int]], output: int
                    ) -> tuple[float, list[list[int]]]:
    params = SamplingParams(max_tokens=output, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    seqs = engine.generate(batch, params)
    return len(batch) * output / (time.perf_counter() - start), [s.output_token_ids for s in seqs]


def hf_generate(model, batch: list[list[int]], output: int, device: torch.device
                ) -> tuple[float, list[list[int]]]:
    ids = torch.tensor(batch, device=device)
    settings = dict(attention_mask=torch.ones_like(ids), do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        model.generate(ids, max_new_tokens=2, **settings)  # warm-up
        synchronize(device)
        start = time.perf_counter()
        out = model.generate(ids, max_new_tokens=output, min_new_tokens=output, **settings)
        synchronize(device)
    return len(batch) * output / (time.perf_counter() - start), out[:, ids.shape[1]:].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--shape", default="1b", choices=sorted(SHAPES))
    parser.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16",
                                                                "float16"))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    parser.add_argument("--output", type=int, default=128, help="output tokens")
    parser.add_argument("--steps", type=int, default=50, help="decode steps timed")
    parser.add_argument("--copy-mib", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads on a CPU")
    parser.add_argument("--attention-batch", type=int, default=64,
                        help="the batch of the decode attention comparison")
    args = parser.parse_args()
    device = resolve_device(args.device)
    torch.set_num_threads(args.threads)
    shape, dtype = SHAPES[args.shape], getattr(torch, args.dtype)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"device: {device.type} ({name}); shape {args.shape}: "
          f"{shape.num_parameters / 1e9:.3f}B parameters, {args.dtype}; torch {torch.__version__}")

    bytes_per_s = bandwidth(device, args.copy_mib, args.rounds)
    weight_bytes = shape.num_parameters * dtype.itemsize
    print(f"copy bandwidth (read + write, {args.copy_mib} MiB): {bytes_per_s / 1e9:.1f} GB/s; "
          f"reading the weights once ({weight_bytes / 1e9:.2f} GB): "
          f"{weight_bytes / bytes_per_s * 1e3:.3f} ms")

    with tempfile.TemporaryDirectory() as folder:
        model = CausalLM.random(shape, seed=0, dtype=dtype)
        save_checkpoint(LoadedModel(shape, model, Tokenizer.default(), []), folder)
        del model
        max_model_len = PROMPT_TOKENS + max(args.output, args.steps) + 8
        base = EngineConfig(model=folder, dtype=args.dtype, device=device.type,
                            max_num_seqs=max(args.batches), max_num_batched_tokens=2048,
                            max_model_len=max_model_len, threads=args.threads,
                            num_kv_blocks=max(args.batches) * -(-max_model_len // 16) + 1)
        # On CUDA: graphs with the default attention (the Triton kernel where it runs), graphs
        # with the gather, eager steps; on a CPU eager steps with the gather.
        updates = ([{}, {"attention": "gather"}, {"enforce_eager": True}]
                   if device.type == "cuda" else [{}])
        results = {}
        for update in updates:
            engine = LLMEngine(base.model_copy(update=update))
            mode = ("eager" if engine.runner.static_decode is None else "graphs") + "/" \
                + engine.attention
            steps = {b: decode_steps(engine, None, b, args.steps, temperature=0.0)[0]
                     for b in args.batches}
            runs = {b: engine_generate(engine, prompts(b, shape.vocab_size), args.output)
                    for b in args.batches}
            results[mode] = steps, runs
            del engine
            gc.collect()
        modes = list(results)
        hf = hf_runs(folder, dtype, device, args)

    kv_per_token = shape.kv_bytes_per_token(dtype.itemsize)
    print(f"\ndecode step, median of {args.steps} ({PROMPT_TOKENS}-token prompts); roofline = "
          "(weights + the KV of every context) / copy bandwidth")
    print(f"{'mode':>13} {'batch':>6} {'step ms':>9} {'roofline ms':>12} {'of roofline':>12}")
    for mode, (steps, _) in results.items():
        for b, ms in steps.items():
            context = PROMPT_TOKENS + args.steps / 2
            roofline = (weight_bytes + b * context * kv_per_token) / bytes_per_s * 1e3
            print(f"{mode:>13} {b:>6} {ms:>9.2f} {roofline:>12.3f} {roofline / ms:>11.1%}")
    print(f"\noutput tokens/s, {PROMPT_TOKENS}-token prompts, {args.output} tokens each "
          "(prefill included)")
    print(f"{'batch':>6} " + " ".join(f"{'engine ' + m:>20}" for m in results)
          + f" {'HF generate':>12} {'x HF':>6} {'same tokens':>12}")
    for b in args.batches:
        tps = [results[m][1][b][0] for m in results]
        ours = results[modes[0]][1][b][1][0][:AGREE_TOKENS]
        if hf is None:
            hf_cells = f"{'not installed':>12} {'':>6} {'':>12}"
        else:
            hf_tps, hf_out = hf[b]
            same = "yes" if hf_out[0][:AGREE_TOKENS] == ours else "no"
            hf_cells = f"{hf_tps:>12.0f} {tps[0] / hf_tps:>5.1f}x {same:>12}"
        print(f"{b:>6} " + " ".join(f"{t:>20.0f}" for t in tps) + " " + hf_cells)
    print(f"(x HF: engine {modes[0]} over HF generate. The goals: batch 64 at 50 % or more of "
          "the roofline, batch 1 at 3x HF generate or more)")
    compare_attention(shape, args.attention_batch, dtype, device)


def hf_runs(folder: str, dtype: torch.dtype, device: torch.device, args
            ) -> dict[int, tuple[float, list[list[int]]]] | None:
    try:
        from transformers import LlamaForCausalLM
        from transformers.utils import logging
    except ImportError:
        print("transformers is not installed (pip install -c constraints.txt -e '.[hf]'): "
              "no Hugging Face comparison")
        return None
    logging.disable_progress_bar()
    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    vocab = model.config.vocab_size
    out = {b: hf_generate(model, prompts(b, vocab), args.output, device)
           for b in args.batches}
    del model
    gc.collect()
    return out


if __name__ == "__main__":
    main()
