"""Closing an engine closes what it carries: the entry's embedding model (``embedding_model``)."""

from __future__ import annotations

from vllmmlxd.engine.loading.loader import load_model
from vllmmlxd.engine.mlx_engine import MLXEngine


class _Embedder:
    def __init__(self, closed: list[str]):
        self.closed = closed

    def close(self) -> None:
        self.closed.append("embedder")


def test_closing_the_engine_closes_its_embedder_first(state_dir):
    engine = MLXEngine(load_model("builtin:tiny", state_dir))
    closed: list[str] = []
    engine.embedder = _Embedder(closed)
    engine.close()
    assert closed == ["embedder"] and not engine._thread.is_alive()
