"""The README's requests run as written against a real worker (builtin:tiny on a free port in
place of make serve's 8000): its Python blocks with the SDKs it tells you to install, its curl lines."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.servers import start_serve

README = Path(__file__).resolve().parents[2] / "README.md"
MAKE_SERVE_URL = "http://127.0.0.1:8000"
# The gateway's Ollama listener; a worker serves the same routes under /ollama (the gateway forwards there).
OLLAMA_URL = "http://127.0.0.1:11434"


def blocks(lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", README.read_text(), re.DOTALL)


@pytest.fixture(scope="module")
def url():
    s = start_serve("builtin:tiny", "--max-request-tokens", "32")  # random weights: keep answers short
    yield s.url
    assert s.stop() == 0, s.log()[-3000:]


def test_the_readme_says_to_install_the_sdks_its_examples_import():
    words = " ".join(README.read_text().replace("`", "").split())
    assert blocks("python") and ".venv/bin/pip install openai anthropic" in words


@pytest.mark.parametrize("index", range(len(blocks("python"))))
def test_each_python_example_runs(url, index):
    code = blocks("python")[index]
    assert MAKE_SERVE_URL in code or OLLAMA_URL in code
    code = code.replace(MAKE_SERVE_URL, url).replace(OLLAMA_URL, url + "/ollama")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout, r.stderr


@pytest.mark.skipif(shutil.which("curl") is None, reason="no curl here")
def test_each_curl_request_runs(url):
    text = "\n".join(blocks("sh")).replace("\\\n", " ")
    lines = [line for line in text.splitlines() if line.startswith("curl ") and MAKE_SERVE_URL in line]
    assert len(lines) >= 2
    for line in lines:
        argv = shlex.split(line.replace(MAKE_SERVE_URL, url))
        r = subprocess.run([*argv, "--fail", "--silent", "--show-error"], capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout, (line, r.stderr)
