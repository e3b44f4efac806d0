"""``python -m vllmmlxd.ctl``: the same as ``vllmmlxctl``."""

import sys

from vllmmlxd.ctl.cli import main

sys.exit(main())
