"""OpenAI-compatible request and response bodies, and OpenAI-style errors."""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal

from annotated_types import Ge, Le, MinLen
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from latlab.engine.sampling_params import SamplingParams


class ApiError(Exception):
    """An error answered as `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


# Fields latlab does not implement (OpenAI's, and vLLM's sampling extensions): refused with a
# clear error unless left at their default. Any other unknown field is ignored, and logged.
UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "suffix": (None, ""),
    "logprobs": (None, False, 0), "top_logprobs": (None, 0), "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0),
    "tools": (None, []), "response_format": (None, {"type": "text"}),
    "min_p": (None, 0, 0.0), "repetition_penalty": (None, 1, 1.0),
    "length_penalty": (None, 1, 1.0), "use_beam_search": (None, False),
    "stop_token_ids": (None, []), "bad_words": (None, []), "allowed_token_ids": (None,),
    "prompt_logprobs": (None, 0), "structured_outputs": (None,), "guided_json": (None,),
    "guided_regex": (None,), "guided_choice": (None,), "guided_grammar": (None,),
}



def _whole(value: Any) -> Any:
    """A whole number written as a float (`75.0`) is the integer JSON Schema says it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _json_equal(a: Any, b: Any) -> bool:
    """Equal as JSON values: `false` is not `0`, though Python says so."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def integer(*bounds: Any) -> Any:
    """An integer field: strict (no bool, no string), but 75.0 is 75, as the schema promises
    (the bounds go inside the conversion, so the schema states them as it should)."""
    return Annotated[(int, *bounds, BeforeValidator(_whole))]


Integer, NonNegative, Positive = integer(), integer(Ge(0)), integer(Ge(1))
# Seeds are int64, as in vLLM and OpenAI's clients; outside that range: 400, never reduced.
Seed = integer(Ge(-(1 << 63)), Le((1 << 63) - 1))
Text = Annotated[str, MinLen(1)]
TokenIds = Annotated[list[NonNegative], Field(min_length=1)]
# Errors a request the schema accepts may still get: what its fields mean together.
CROSS_FIELD_CODES = ("context_length_exceeded", "min_tokens_above_max_tokens",
                     "chat_template_error")


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The body of every error answer (`ApiError.body()`)."""

    error: ErrorDetail


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    include_usage: bool = False
    continuous_usage_stats: bool = False


def _unsupported_in_schema(schema: dict[str, Any]) -> None:
    """The fields latlab does not implement, each documented with the values it takes."""
    schema["properties"].update({
        name: {"enum": [v for i, v in enumerate(values)
                        if not any(_json_equal(v, w) for w in values[:i])],
               "description": "not supported by latlab serve beyond its default"}
        for name, values in UNSUPPORTED_DEFAULTS.items()})


class GenerationRequest(BaseModel):
    """Sampling fields shared by completions and chat, with latlab's (vLLM's) extensions.
    What the schema cannot say: the prompt and `max_tokens` must fit the model's context
    (else 400 `context_length_exceeded`), and `min_tokens` may not exceed `max_tokens`
    (400 `min_tokens_above_max_tokens`)."""

    model_config = ConfigDict(extra="allow", strict=True,
                              json_schema_extra=_unsupported_in_schema)

    model: str | None = None
    max_tokens: Positive | None = None
    # OpenAI's current name for the limit (AIPerf sends it to /v1/completions too); it wins
    max_completion_tokens: Positive | None = None
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: Integer = Field(0, ge=-1, description="-1 or 0: off; above the vocabulary: all "
                           "tokens")
    seed: Seed | None = None
    stop: Text | Annotated[list[Text], Field(max_length=16)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: NonNegative = 0
    priority: Integer = 0
    user: str | None = Field(None, max_length=256)

    @model_validator(mode="after")
    def _refuse_unsupported(self) -> GenerationRequest:
        for name, value in (self.model_extra or {}).items():
            if name in UNSUPPORTED_DEFAULTS and not any(
                    _json_equal(value, d) for d in UNSUPPORTED_DEFAULTS[name]):
                raise ValueError(f"{name}={value!r} is not supported by latlab serve")
        return self

    @property
    def output_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def ignored(self) -> list[str]:
        """The fields this request carries that latlab serve does not know (it ignores them)."""
        return sorted(set(self.model_extra or {}) - UNSUPPORTED_DEFAULTS.keys())

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return SamplingParams(
            max_tokens=max_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=max(self.top_k, 0), seed=self.seed, stop=tuple(stop),
            ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
        )


class CompletionRequest(GenerationRequest):
    # One prompt: text or token ids, alone or as OpenAI's list of one.
    prompt: (Text | Annotated[list[Text], Field(min_length=1, max_length=1)] | TokenIds
             | Annotated[list[TokenIds], Field(min_length=1, max_length=1)])


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None

    @property
    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class ChatCompletionRequest(GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(BaseModel):
    accepted_prediction_tokens: int = 0  # speculative decoding: drafts accepted
    rejected_prediction_tokens: int = 0  # and rejected


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails | None = None

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int) -> Usage:
        return cls(prompt_tokens=prompt, completion_tokens=completion,
                   total_tokens=prompt + completion,
                   prompt_tokens_details=PromptTokensDetails(cached_tokens=cached))


class ResponseBase(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class CompletionResponse(ResponseBase):
    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str | None


class ChatCompletionResponse(ResponseBase):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[ChatChoice]
    usage: Usage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "latlab"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
