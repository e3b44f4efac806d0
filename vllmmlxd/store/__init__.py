"""The model store: models pulled from the Hugging Face hub into the state directory, beside the
builtins and GGUF files converted there, and the daemon's pulls that fill it.

- ``sources.py`` (pure): what ``vllmmlxctl pull`` accepts, read into a repo id and a revision.
- ``layout.py``: where a model is on disk (the store's copy, else the hub cache), and its folder names.
- ``catalog.py``: what the store holds (sizes, sources, the entries that use each) and removing one.
- ``disk.py`` (pure): disk admission, and bytes as people read them.
- ``progress.py`` (pure): a download's speed and time left from its recent progress.
- ``fetch.py``: one pull, as a child process (``python -m vllmmlxd.store.fetch``): the hub's listing,
  disk admission, ``huggingface_hub.snapshot_download``, the checksums, the install.
- ``pulls.py``: the daemon's side: one pull per repo, its child, its state and whoever follows it.

Stdlib only but for ``fetch.py``, which the daemon runs and never imports (huggingface_hub stays
out of the daemon's process, and a cancelled pull is a killed process).
"""
