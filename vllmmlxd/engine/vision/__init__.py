"""Images in prompts: rendered with the model's processor (``vision_prompt``) and prefilled
from embeddings before they join the batch (``vision_prefill``; its step hook is
``step.staged_prompts``)."""

__all__ = ["vision_prefill", "vision_prompt"]
