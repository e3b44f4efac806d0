"""process.py: a worker's stderr is forwarded line by line, even lines far longer than 64 KiB."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.supervisor.slot.process import MAX_LINE, WorkerProcess


def test_long_stderr_lines_are_cut_and_forwarding_goes_on():
    script = (
        "import sys; w = sys.stderr.write;"
        "w('level=info event=first\\n'); w('x' * 300000 + '\\n'); w('level=info event=after\\n');"
        "w('y' * 100 + '\\n'); w('tail without newline')"
    )

    async def main():
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", script, stdin=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        lines: list[str] = []
        worker = WorkerProcess("a", ModelConfig(model="builtin:tiny"), proc, Path("/nonexistent"), lines.append)
        assert await worker.wait() == 0
        return lines

    lines = asyncio.run(main())
    assert lines[0] == "level=info event=first"
    assert "x" * 1000 in lines[1] and len(lines[1]) < MAX_LINE + 200 and "[cut]" in lines[1]
    assert lines[2] == "level=info event=after"
    assert "y" * 100 in lines[3] and "tail without newline" in lines[4] and len(lines) == 5
