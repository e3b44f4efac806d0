"""From a request to what the engine runs, the same for every API family: the rendered
conversation and the engine request with its sampling resolved."""

from __future__ import annotations

from ..engine.types import GenerationRequest
from ..errors import InvalidRequest
from .context import ServingContext
from .sampling import SamplingRequest, resolve_sampling


def render_template(ctx: ServingContext, messages: list[dict], tools: list[dict] | None, kwargs: dict | None) -> list[int]:
    """The conversation as prompt tokens; a template's refusal is the client's 400."""
    if not ctx.engine.info.has_chat_template:
        raise InvalidRequest("this model has no chat template; use /v1/completions", param="messages")
    try:
        return ctx.engine.apply_chat_template(messages, tools=tools, template_kwargs=kwargs)
    except InvalidRequest:
        raise
    except Exception as exc:  # jinja raises on conversations the template refuses
        raise InvalidRequest(f"the chat template rejected these messages: {exc}", param="messages") from None


def make_generation(
    ctx: ServingContext, sampling: SamplingRequest, prompt: list[int], rid: str, *, reasoning: bool,
) -> GenerationRequest:
    """The engine request for ``prompt``: sampling merged with the model's defaults, the request's id."""
    params = resolve_sampling(
        sampling, ctx.config, prompt_len=len(prompt),
        context_length=ctx.engine.info.context_length, vocab_size=ctx.engine.info.vocab_size,
    )
    return GenerationRequest(prompt_tokens=prompt, sampling=params, request_id=rid,
                             stream_interval=ctx.config.stream_interval, reasoning=reasoning)
