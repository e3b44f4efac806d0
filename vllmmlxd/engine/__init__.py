"""The engine: a model loaded with MLX, serving many requests at once on one thread.

The face (what the API layer uses): ``mlx_engine.MLXEngine`` (the ``types.Engine`` protocol:
render a chat, generate events, embed), ``types`` (requests, events, the engine's stats) and
``options`` (an entry's engine settings). Inside, by how data flows:

- ``loading``: weights to a model (mlx-lm, GGUF, builtins), tokenizer and chat template.
- ``step``: the engine thread. Requests wait, are admitted, step through the batch, end.
- ``batch``: the batch the step drives; mlx-lm's generator and the one adapter over its
  private parts; the plan of each step's changes.
- ``cache``: the prefix cache, in memory and on disk, whole sequences or blocks.
- ``speculation``: drafting inside the batch and its adaptive width.
- ``vision``: images into prompts, and their prefill from embeddings.
- ``distributed``: a model split over ranks; rank 0 sends each step's plan, the others play it.
- ``embeddings``: embedding models, batched beside generation.
- ``text``: tokens to text and back: detokenizing, stops, grammars, templates' variables.

Each subpackage's ``__init__`` names the modules other packages may use (``__all__``); the rest
are its own (tests/unit/test_layout_surface.py holds it).
"""

__all__ = ["mlx_engine", "options", "types"]
