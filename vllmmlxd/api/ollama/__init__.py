"""Ollama's API (chat, generate, embeddings, show, ps) as a fourth family on the shared chat pipeline."""
