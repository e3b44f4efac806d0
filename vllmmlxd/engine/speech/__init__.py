"""Speech to text: Whisper through mlx-audio on a thread of its own (``transcriber``), uploads
decoded with PyAV (``decode``), transcripts in OpenAI's formats (``formats``)."""

__all__ = ["decode", "formats", "speech_engine", "transcriber"]
