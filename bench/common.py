"""What the benchmarks in bench/ share: the machine's name, bench-only venvs, sections of docs/benchmarks.md.

Stdlib only, so that a script can import it before it decides what else to load.
"""

from __future__ import annotations

import platform
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cpu_name() -> str:
    """The processor's marketing name (``model name`` in /proc/cpuinfo, or sysctl on macOS)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True).stdout
        if out.strip():
            return out.strip()
    return platform.processor() or platform.machine() or "unknown CPU"


def llama_params(cfg: dict) -> int:
    """Parameters of a llama ``config.json`` (tied embeddings, norms left out)."""
    h, i, layers, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    kv = cfg["num_key_value_heads"] * h // cfg["num_attention_heads"]
    return v * h + layers * (2 * h * h + 2 * h * kv + 3 * h * i)


def ensure_venv(venv: Path, packages: list[str]) -> Path:
    """A bench-only virtual environment holding ``packages`` (never vllmmlxd's own), built once; its python.

    Raises RuntimeError with the end of pip's output when the install fails.
    """
    python = venv / "bin" / "python"
    marker = venv / ".bench-installed"
    wanted = " ".join(packages)
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    print(
        f"installing {wanted} into {venv.relative_to(REPO) if venv.is_relative_to(REPO) else venv} (minutes, once)",
        file=sys.stderr,
    )
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", *packages], capture_output=True, text=True)
    if proc.returncode != 0:
        out = proc.stderr or proc.stdout
        errors = [line for line in out.splitlines() if line.startswith("ERROR")]
        raise RuntimeError(f"pip install {wanted} failed ({proc.returncode}): {chr(10).join(errors) or out[-1500:]}")
    marker.write_text(wanted)
    return python


def write_section(path: Path, heading: str, text: str, intro: str = "# Benchmarks\n") -> None:
    """Replace the section of ``path`` that starts with the line ``heading`` by ``text``, or append it."""
    doc = path.read_text() if path.exists() else intro
    pattern = re.compile(r"^" + re.escape(heading) + r"[ \t]*\n.*?(?=\n## |\Z)", re.S | re.M)
    body = text.rstrip("\n") + "\n"
    doc = pattern.sub(lambda _: body, doc, count=1) if pattern.search(doc) else doc.rstrip("\n") + "\n\n" + body
    path.write_text(doc)


def publish(lines: list[str], path: Path | None) -> None:
    """A bench's section: printed, and written into ``path`` (docs/benchmarks.md) under its heading (``lines[0]``)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if path is not None:
        write_section(path, lines[0], text)
