"""The child that converts a GGUF file (engine/loading/gguf_convert.py starts it and reads its end).

python -m vllmmlxd.engine.loading.gguf_child FILE.gguf FOLDER
"""

from __future__ import annotations

import sys
from pathlib import Path

from vllmmlxd.engine.loading import gguf
from vllmmlxd.engine.loading.gguf_convert import ERROR_PREFIX, EXIT_REFUSED
from vllmmlxd.errors import ModelLoadError


def main(argv: list[str]) -> int:
    """The child: convert ``argv[0]`` into the existing folder ``argv[1]``."""
    if len(argv) != 2:
        print("usage: python -m vllmmlxd.engine.loading.gguf_child FILE.gguf FOLDER", file=sys.stderr)
        return 2
    try:
        gguf.convert_gguf(Path(argv[0]), Path(argv[1]))
    except ModelLoadError as exc:
        print(f"{ERROR_PREFIX}{' '.join(str(exc).splitlines())}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
