"""Rebuild the bundled tokenizer: byte-level BPE trained on Python's own documentation.

The corpus is `pydoc_data.topics` (the language reference that ships with CPython), so the
result is reproducible on any machine with the same Python and `tokenizers` versions:

    python scripts/build_tokenizer.py            # writes latlab/tokenizer/tokenizer.json
"""

from __future__ import annotations

import argparse
from pathlib import Path
from pydoc_data.topics import topics

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

VOCAB_SIZE = 8192
SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
OUT = Path(__file__).resolve().parent.parent / "latlab" / "tokenizer" / "tokenizer.json"


def build(vocab_size: int = VOCAB_SIZE) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = [topics[key] for key in sorted(topics)]
    tokenizer.train_from_iterator(corpus, trainer=trainer, length=len(corpus))
    return tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--vocab-size", type=int, default=VOCAB_SIZE)
    args = parser.parse_args()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    build(args.vocab_size).save(str(args.out))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
