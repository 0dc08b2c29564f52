"""The OpenAI API's requests, responses and error body, as far as rdurack serves them.

Fields follow OpenAI's API reference (chat completions, completions, models); a field
rdurack does not act on but a client may send is accepted (`temperature`, `top_p`,
`user`, ...) and one it cannot honour is refused by name (`n` other than 1). `usage`
also carries SambaNova Cloud's timing fields, in seconds, so its benchmarking clients
read them as from the real service; here they hold the emulated figures.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# Assumption: a chat completion without max_tokens generates at most this many tokens.
# OpenAI's default is the model's whole context; a bound keeps a forgotten field from
# holding a batch slot for minutes.
DEFAULT_CHAT_MAX_TOKENS = 256
# OpenAI's documented default for the legacy completions endpoint.
DEFAULT_COMPLETION_MAX_TOKENS = 16


class Lenient(BaseModel):
    """A request: unknown fields are accepted and ignored, as OpenAI's servers do."""

    model_config = ConfigDict(extra="allow")


class StreamOptions(Lenient):
    include_usage: bool = False


class Sampling(Lenient):
    """What both endpoints share."""

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    n: int = 1
    stop: str | list[str] | None = None
    seed: int | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, ge=0, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None

    @field_validator("n")
    @classmethod
    def _one(cls, n: int) -> int:
        if n != 1:
            raise ValueError("only n = 1 is served")
        return n

    @field_validator("stop")
    @classmethod
    def _four(cls, stop: str | list[str] | None) -> str | list[str] | None:
        if isinstance(stop, list) and len(stop) > 4:
            raise ValueError("at most 4 stop sequences")
        return stop

    def stops(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else self.stop or []
        return [s for s in stops if s]

    def limit(self) -> int:
        """The most tokens to generate."""
        return self.max_tokens or DEFAULT_COMPLETION_MAX_TOKENS


class ChatMessage(Lenient):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text: a string, or its text parts joined."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class ChatRequest(Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)

    def limit(self) -> int:
        return self.max_completion_tokens or self.max_tokens or DEFAULT_CHAT_MAX_TOKENS


class CompletionRequest(Sampling):
    prompt: str | list[str]

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt: str | list[str]) -> str | list[str]:
        if isinstance(prompt, list) and len(prompt) != 1:
            raise ValueError("one prompt per request")
        return prompt

    def text(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]


class Usage(BaseModel):
    """OpenAI's token counts, and SambaNova's timing fields (emulated seconds)."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    time_to_first_token: float
    total_latency: float
    completion_tokens_per_sec: float
    completion_tokens_after_first_per_sec: float
    batch_size_used: int


def error_body(
    message: str, kind: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
