"""The HTTP API families a worker serves, on one shared chat pipeline.

Each family is a subpackage with the same four parts: ``protocol`` (the wire models, as the
family's published spec defines them), ``translate`` (a request to the engine's chat and
sampling), ``encode`` (engine events to the family's response and stream events) and
``routes`` (its FastAPI router): ``openai`` (chat/completions, completions, embeddings),
``responses`` (OpenAI's Responses API, with its store), ``anthropic`` (Messages) and ``ollama``.
What they share is beside them: ``chat`` and ``turn`` (one generation, its tools and reasoning),
``tool_loop`` (MCP tools run by the server), ``stream`` and ``sse`` (event streams),
``errors`` (each family's error shape), ``context`` (what a route needs of the worker),
``images`` (image inputs and their budget), ``body`` (request bodies and their limits),
``files`` (inline files as text), ``tokenizer_routes`` (vLLM's /tokenize, /detokenize, /tokenizer_info),
``rerank`` (vLLM's /v1/rerank and /v1/score over a reranking entry).

Other packages use what ``__all__`` names; the rest is the API's own.
"""

__all__ = [
    "anthropic",
    "body",
    "context",
    "errors",
    "mcp_routes",
    "ollama",
    "openai",
    "openapi",
    "rerank",
    "responses",
    "tokenizer_routes",
]
