"""A model split over ranks (MLX's distributed runtime): rank 0's scheduler decides and sends
each step's plan (``lockstep``), the others play it (``follow``); how the weights are split
(``shard_llama``, ``pipeline_llama``, ``shard_load``), how ranks meet (``rank_group``,
``handshake``) and talk (``ring_link``)."""

__all__ = ["follow", "handshake", "lockstep", "rank_group", "ring_link", "shard_llama", "shard_load"]
