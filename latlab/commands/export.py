"""`latlab tokenizer export` and `latlab model export`: the engine's tokenizer and presets as
Hugging Face folders, so other tools count tokens and serve models the same way."""

from __future__ import annotations

from pathlib import Path

from latlab.commands.common import UsageError, console
from latlab.commands.options import Options
from latlab.records.settings import setting


class TokenizerExportOptions(Options):
    model: str = setting("default", "A preset or a checkpoint folder, as in serve.")


def tokenizer_export(folder: Path, options: TokenizerExportOptions) -> None:
    """Write the tokenizer as a Hugging Face folder, so other tools count tokens the same way."""
    from latlab.engine.config import PRESETS
    from latlab.tokenizer import Tokenizer, TokenizerError

    try:
        tokenizer = Tokenizer.load(None if options.model in PRESETS else options.model)
    except TokenizerError as e:
        raise UsageError(str(e)) from None
    console().print(f"wrote {tokenizer.save_pretrained(folder)}", highlight=False)


class ModelExportOptions(Options):
    model: str = setting("default", "The preset to export.")
    seed: int = setting(0, "Seed of the random weights (as `latlab serve --seed`).")
    gguf: bool = setting(False, "Also write it as GGUF (FOLDER/model.gguf) for llama.cpp.")


def model_export(folder: Path, options: ModelExportOptions) -> None:
    """Write a preset as a Hugging Face Llama checkpoint (config.json, model.safetensors,
    tokenizer), so other engines can serve the very same model."""
    import torch

    from latlab.engine.config import PRESETS
    from latlab.engine.loader import load_model, save_checkpoint

    if options.model not in PRESETS:
        raise UsageError(f"--model must be one of {', '.join(PRESETS)}")
    path = save_checkpoint(load_model(options.model, torch.float32, options.seed), folder)
    console().print(f"wrote {path}", highlight=False)
    if options.gguf:
        from latlab.engine.gguf import GgufError, write_gguf

        try:
            console().print(f"wrote {write_gguf(path)}", highlight=False)
        except GgufError as e:
            raise UsageError(str(e)) from None
