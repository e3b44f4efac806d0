"""The engine checked against mlx-lm on the machine it runs on: mlx-lm's own greedy answers (the
oracle), the near-tie rule that judges a departure from them, a driver that steps the scheduler
through one path, and the doctor's self-test (``python -m vllmmlxd.engine.selftest``) over the
batch, the prefix cache, speculation and the quantized KV cache. The engine's fidelity tests
(tests/support/fidelity.py) use the same oracle, rule and driver."""

__all__ = ["agreement", "driver", "engine_paths", "oracle"]
