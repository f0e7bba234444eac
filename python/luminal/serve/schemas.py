"""Request bodies of the OpenAI API subset the server speaks, validated strictly: a wrong
type or an out-of-range value is a 400 naming the field."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr

Number = Annotated[float, Field(strict=False)]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(_Body):
    type: Literal["text"]
    text: StrictStr


class Message(_Body):
    role: Literal["system", "developer", "user", "assistant"]
    content: StrictStr | list[TextPart]

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class StreamOptions(_Body):
    include_usage: StrictBool = False


class _Sampling(_Body):
    model: StrictStr
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: Number = Field(default=1.0, ge=0.0, le=2.0)
    top_p: Number = Field(default=1.0, gt=0.0, le=1.0)
    stop: StrictStr | list[StrictStr] | None = None
    seed: StrictInt | None = None
    n: StrictInt = 1
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    user: StrictStr | None = None

    def stops(self) -> list[str]:
        s = self.stop
        out = [s] if isinstance(s, str) else list(s or [])
        return out


class ChatRequest(_Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    logprobs: StrictBool | None = None
    top_logprobs: StrictInt | None = Field(default=None, ge=0, le=20)


class CompletionRequest(_Sampling):
    prompt: StrictStr | list[StrictStr] | list[StrictInt]
    echo: StrictBool = False
    logprobs: StrictInt | None = Field(default=None, ge=0, le=5)
    suffix: StrictStr | None = None


class EmbeddingRequest(_Body):
    model: StrictStr
    input: StrictStr | list[StrictStr]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: StrictInt | None = None
    user: StrictStr | None = None


def describe(errors: list[Any]) -> tuple[str, str | None]:
    """A one-line message and the offending parameter from pydantic's error list."""
    e = errors[0]
    loc = ".".join(str(p) for p in e.get("loc", ()) if not str(p).startswith("function-"))
    # union members add their type name to the location: keep the field path readable
    parts = [p for p in loc.split(".") if p not in ("str", "list[str]", "list[int]", "int")]
    param = ".".join(parts) or None
    msg = e.get("msg", "invalid value")
    if e.get("type") == "missing":
        return f"missing required parameter {param!r}", param
    return f"invalid value for {param!r}: {msg}", param
