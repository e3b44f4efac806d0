"""The prefix cache: whole sequences or blocks (``cache_setup`` picks), in memory and on disk
(``block_disk``), with windowed layers' KV and recurrent states (``layered_kv``,
``checkpoints``) for the families that have them."""

__all__ = [
    "block_cache",
    "block_disk",
    "block_file",
    "block_tree",
    "cache_setup",
    "checkpoints",
    "kv",
    "layered_kv",
    "prefix_cache",
]
