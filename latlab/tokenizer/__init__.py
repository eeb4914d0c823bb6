"""Tokenizer through the `tokenizers` library: the bundled default, or a Hugging Face one.

Torch-free on purpose: the load generator builds prompts of exact token counts with it.
The bundled tokenizer is built by `scripts/build_tokenizer.py`; `save_pretrained` writes it
as a Hugging Face tokenizer folder so other benchmark tools count tokens the same way.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from importlib.resources import files
from pathlib import Path

import tokenizers

BOS, EOS = "<|bos|>", "<|eos|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
# ChatML as a Jinja template: the same text as `apply_chat_template`'s fallback, written to an
# exported tokenizer_config.json so that other servers format chats the same way.
CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


class TokenizerError(Exception):
    """A tokenizer that cannot be found or read."""


@dataclass
class Tokenizer:
    backend: tokenizers.Tokenizer
    eos_token: str | None = EOS
    bos_token: str | None = None
    chat_template: str | None = None

    @classmethod
    def default(cls) -> Tokenizer:
        path = files("latlab.tokenizer") / "tokenizer.json"
        return cls(tokenizers.Tokenizer.from_str(path.read_text(encoding="utf-8")))

    @classmethod
    def load(cls, path: str | Path | None) -> Tokenizer:
        """`None` or "default": the bundled one; a tokenizer.json file; or an HF folder."""
        if path is None or str(path) == "default":
            return cls.default()
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise TokenizerError(f"{path}: no tokenizer.json found")
        try:
            backend = tokenizers.Tokenizer.from_file(str(file))
        except Exception as e:  # the library raises bare Exceptions on bad files
            raise TokenizerError(f"{file}: not a readable tokenizer: {e}") from e
        tokenizer = cls(backend, eos_token=None)
        config = file.parent / "tokenizer_config.json"
        if config.is_file():
            meta = json.loads(config.read_text(encoding="utf-8"))
            tokenizer.eos_token = _token_text(meta.get("eos_token"))
            tokenizer.bos_token = _token_text(meta.get("bos_token"))
            template = meta.get("chat_template")
            tokenizer.chat_template = template if isinstance(template, str) else None
        elif backend.token_to_id(EOS) is not None:
            tokenizer.eos_token = EOS
        return tokenizer

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def eos_token_id(self) -> int | None:
        return self.backend.token_to_id(self.eos_token) if self.eos_token else None

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def decode_stream(self) -> tokenizers.decoders.DecodeStream:
        """An incremental decoder: `step(self.backend, id)` gives the new text, or None."""
        return tokenizers.decoders.DecodeStream(skip_special_tokens=True)

    @cached_property
    def token_bytes(self) -> list[bytes] | None:
        """The bytes each token id decodes to (b"" for special tokens), for byte-level BPE
        tokenizers (GPT-2, Qwen2, the bundled one); None for any other decoder."""
        decoder = json.loads(self.backend.to_str()).get("decoder") or {}
        if decoder.get("type") != "ByteLevel":
            return None
        byte_of = {c: b for b, c in _gpt2_byte_chars().items()}
        vocab = self.backend.get_vocab(with_added_tokens=True)
        table = [b""] * (max(vocab.values()) + 1)
        for token, i in vocab.items():
            if all(c in byte_of for c in token):
                table[i] = bytes(byte_of[c] for c in token)
            else:
                table[i] = token.encode()
        for i, added in self.backend.get_added_tokens_decoder().items():
            table[i] = b"" if added.special else added.content.encode()
        return table

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for chat messages, ending where the assistant's reply begins.

        A model's own Jinja template is used when it has one; otherwise ChatML. A template
        that rejects the messages raises `jinja2.TemplateError`.
        """
        if self.chat_template:
            import time

            import jinja2

            def raise_exception(message: str) -> None:
                raise jinja2.TemplateError(message)

            env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
            # The helpers Hugging Face templates call (transformers defines the same two).
            env.globals.update(raise_exception=raise_exception,
                               strftime_now=lambda fmt: time.strftime(fmt))
            return env.from_string(self.chat_template).render(
                messages=messages,
                add_generation_prompt=True,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        parts = [f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages]
        return "".join(parts) + f"{IM_START}assistant\n"

    def save_pretrained(self, folder: str | Path) -> Path:
        """Write a Hugging Face tokenizer folder (`AutoTokenizer.from_pretrained` loads it)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(folder / "tokenizer.json"))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "eos_token": self.eos_token,
            "bos_token": self.bos_token,
            "model_max_length": 1 << 20,
        }
        if self.chat_template:
            config["chat_template"] = self.chat_template
        elif self.backend.token_to_id(IM_START) is not None:
            config["chat_template"] = CHATML_TEMPLATE  # what apply_chat_template falls back to
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
        (folder / "special_tokens_map.json").write_text(
            json.dumps({k: v for k, v in config.items() if k.endswith("_token") and v}, indent=2)
        )
        return folder


def _token_text(value: object) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _gpt2_byte_chars() -> dict[int, str]:
    """GPT-2's printable stand-in for every byte, as byte-level BPE vocabularies spell them."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    extra = (b for b in range(256) if b not in printable)
    return {**{b: chr(b) for b in printable}, **{b: chr(256 + n) for n, b in enumerate(extra)}}
