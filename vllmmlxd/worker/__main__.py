import os
import sys

from ..runtime import import_memo

import_memo.install()  # before anything imports transformers

from .main import main  # noqa: E402

code = main()
sys.stdout.flush()
sys.stderr.flush()
# Skip interpreter teardown: MLX's C++ stream threads can abort the process when static
# destructors run, turning a clean drain into exit code -6.
os._exit(code)
