"""OpenAI's Responses API (``POST /v1/responses``), a third family on the shared chat pipeline."""
