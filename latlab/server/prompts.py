"""Request bodies to token ids, off the event loop.

Parsing, the chat template and tokenization run in a small thread pool so that `/health` and
every stream keep flowing while a long prompt is split: the tokenizer's batch call releases
the GIL, its single-text call does not. A prompt with more characters than the context's
tokens could cover is refused before it is tokenized at all.
"""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import jinja2
from pydantic import BaseModel, ValidationError

from latlab.server.schemas import ApiError, ChatCompletionRequest, CompletionRequest
from latlab.tokenizer import Tokenizer

Body = TypeVar("Body", bound=BaseModel)

# Normalizers (NFC, NFKC) can fold up to three characters into one before the split.
NORMALIZER_FOLD = 4


class PromptBuilder:
    """Parses a body and builds its prompt's token ids in a worker thread."""

    def __init__(self, tokenizer: Tokenizer, max_model_len: int, vocab_size: int,
                 workers: int = 4) -> None:
        self.tokenizer = tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = vocab_size
        # No token covers more characters than its own vocabulary entry has.
        longest = max(map(len, tokenizer.backend.get_vocab(with_added_tokens=True)), default=1)
        self.max_chars = max_model_len * longest * NORMALIZER_FOLD
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="latlab-prompt")

    async def completion(self, data: bytes) -> tuple[CompletionRequest, list[int]]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._completion,
                                                                data)

    async def chat(self, data: bytes) -> tuple[ChatCompletionRequest, list[int]]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._chat, data)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _completion(self, data: bytes) -> tuple[CompletionRequest, list[int]]:
        body = parse(data, CompletionRequest)
        prompt = body.prompt
        if prompt and isinstance(prompt[0], (list, str)) and not isinstance(prompt, str):
            if len(prompt) != 1:
                raise ApiError(400, "latlab serve takes one prompt per request", param="prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return body, self._encode(prompt, "prompt")
        if len(prompt) >= self.max_model_len:
            raise self._too_long(f"{len(prompt)} tokens", "prompt")
        if any(not 0 <= t < self.vocab_size for t in prompt):
            raise ApiError(400, f"prompt token ids must be in [0, {self.vocab_size})",
                           param="prompt")
        return body, list(prompt)

    def _chat(self, data: bytes) -> tuple[ChatCompletionRequest, list[int]]:
        body = parse(data, ChatCompletionRequest)
        messages = [{"role": m.role, "content": m.text} for m in body.messages]
        try:
            prompt = self.tokenizer.apply_chat_template(messages)
        except jinja2.TemplateError as e:
            raise ApiError(400, f"the model's chat template rejects these messages: {e}",
                           param="messages", code="chat_template_error") from None
        return body, self._encode(prompt, "messages")

    def _encode(self, text: str, param: str) -> list[int]:
        if len(text) > self.max_chars:
            raise self._too_long(f"{len(text)} characters, more than {self.max_chars} "
                                 "that many tokens can cover", param)
        return self._tokenize(text)

    def _tokenize(self, text: str) -> list[int]:
        # As Tokenizer.encode, through the batch call that releases the GIL.
        return self.tokenizer.backend.encode_batch([text], add_special_tokens=False)[0].ids

    def _too_long(self, what: str, param: str) -> ApiError:
        return ApiError(400, f"This model's maximum context length is {self.max_model_len} "
                        f"tokens; the prompt has {what}.", param=param,
                        code="context_length_exceeded")


def parse(data: bytes, model: type[Body]) -> Body:
    try:
        return model.model_validate_json(data)
    except ValidationError as e:
        raise _invalid(e) from None


def _invalid(e: ValidationError) -> ApiError:
    """A 400 naming the first bad field; for a field of several types, the types it takes."""
    errors = e.errors(include_url=False)
    if errors[0]["type"] == "json_invalid":
        return ApiError(400, f"the body is not valid JSON: {errors[0]['msg']}")
    # a union branch of the right type that failed a bound says more than the others' types
    first = next((err for err in errors if not err["type"].endswith("_type")), errors[0])
    loc = [p for p in first["loc"] if not _is_type_tag(p)]
    param = ".".join(map(str, loc)) or None
    tags = [_type_name(err["loc"][len(loc)]) for err in errors
            if len(err["loc"]) > len(loc) and list(err["loc"][: len(loc)]) == loc
            and _is_type_tag(err["loc"][len(loc)])]
    if len(tags) > 1 and first["type"].endswith("_type"):
        message = (f"{type(first['input']).__name__} is not accepted; "
                   f"it takes {', '.join(dict.fromkeys(tags))}")
    else:
        message = first["msg"].removeprefix("Value error, ")
    return ApiError(400, f"{param}: {message}" if param else message, param=param)


def _is_type_tag(part: Any) -> bool:
    """Pydantic's name for one branch of a union in an error location (`str`, `list[int]`,
    `constrained-str`)."""
    return isinstance(part, str) and (part.removeprefix("constrained-") in
                                      ("str", "int", "float", "bool") or "[" in part)


def _type_name(tag: str) -> str:
    """A union branch as the JSON it takes: `list[function-before[_whole(),
    constrained-int]]` is `list[int]`."""
    return re.sub(r"function-before\[\w+\(\), (int)\]", r"\1",
                  tag.replace("constrained-", ""))
