"""The engine thread's loop: requests wait, are admitted (``admission``: rows and KV bytes),
step through the batch (``scheduler``: the same pass for every model, features as
``step_hooks``), and end; their KV goes to the prefix cache (``store_queue``). ``sequence``
holds one request's state and turns its tokens into events."""

__all__ = ["kv_budget", "kv_probe", "logprobs", "scheduler", "sequence", "step_timer", "store_queue"]
