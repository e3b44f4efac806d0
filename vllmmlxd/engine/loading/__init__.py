"""Weights to a model: mlx-lm folders, GGUF files (converted in a child process), and the
builtin models tests and first runs use; the BLAS library check at load."""

__all__ = ["blas_check", "builtin", "builtin_vlm", "builtin_whisper", "gguf", "gguf_convert", "loader"]
