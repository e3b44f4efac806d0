"""An entry's ``speculative:`` section: drafting tokens and verifying them in one forward pass."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import BeforeValidator, Field, model_validator

from .base import Strict

SPECULATIVE_METHODS = ("prompt-lookup", "draft", "mtp")
OFF = "off"  # `speculative: off` (or false, or null): no speculation


class SpeculativeConfig(Strict):
    """``speculative: {method: prompt-lookup, num_draft: 4, ngram: 6}``,
    ``{method: draft, draft_model: SPEC, num_draft: 3}``, or ``{method: mtp}``."""

    method: Literal["prompt-lookup", "draft", "mtp"] = Field(
        "prompt-lookup",
        description="prompt-lookup: drafts from the request's own prompt and output; "
        "draft: a small model of the same tokenizer drafts; "
        "mtp: the checkpoint's own multi-token-prediction layers draft (Qwen3.5/3.6)",
    )
    num_draft: int = Field(4, ge=1, le=16, description="tokens drafted per step at most")
    ngram: int = Field(6, ge=1, le=8, description="prompt-lookup: the last this-many tokens are looked up (down to 2)")
    draft_model: str | None = Field(None, description="draft: the drafting model (any model spec)")
    adaptive: bool = Field(
        True,
        description="draft only where it pays (from measured costs and each request's acceptance); "
        "false: every request drafts num_draft tokens every step",
    )

    @model_validator(mode="after")
    def _method_has_what_it_needs(self) -> Self:
        if self.method == "draft" and not self.draft_model:
            raise ValueError("method: draft needs draft_model")
        if self.method != "draft" and self.draft_model:
            raise ValueError("draft_model is for method: draft")
        return self


def _off_is_none(value: object) -> object:
    # `speculative: false` (or off, or null) turns the default prompt lookup off.
    return None if value is False or value is None or (isinstance(value, str) and value.lower() == OFF) else value


# The section, or off: unset, an entry drafts by prompt lookup (adaptive).
Speculation = Annotated[SpeculativeConfig | None, BeforeValidator(_off_is_none)]
