"""Output parsers: turn a model's generated text into typed pieces (reasoning, answer text).

Pure text in, pure data out; no mlx, no HTTP. The engine runs one parser per request
between its detokenizer and its events, so every API family reads the same typed stream.
``fim`` holds the other direction for code models: the fill-in-the-middle prompt forms.
"""
