"""`make serve` as a newcomer runs it: the daemon on config/default.yaml, serving the
embedded SmolLM2-135M-Instruct, answering a real question through the openai SDK."""

from __future__ import annotations

import os
import platform
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import openai
import pytest

from tests.support.servers import free_port, version_fields, wait_healthy

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_make_serve_answers_health_and_names_paris():
    port, gateway = free_port(), free_port()
    work = Path(tempfile.mkdtemp(prefix="vd-serve-"))
    config = work / "config.yaml"
    text = (REPO / "config" / "default.yaml").read_text().replace("port: 8000", f"port: {port}")
    text = text.replace("port: 8080", f"port: {gateway}")
    config.write_text(text + f"daemon:\n  control_socket: {work / 'ctl.sock'}\n")
    log = work / "serve.log"
    proc = subprocess.Popen(
        ["make", "-s", "serve", f"CONFIG={config}"],
        cwd=REPO,
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, "MAKEFLAGS": ""},
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc, log, timeout=600)
        assert httpx.get(f"http://127.0.0.1:{port}/health").json() == {
            "status": "ok",
            "model": "default",
            **version_fields(),
        }
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="not-needed", max_retries=0, timeout=300)
        r = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            temperature=0,
            max_tokens=40,
        )
        answer = r.choices[0].message.content
        assert "Paris" in answer and len(answer.split()) >= 3, answer
        # On Linux x86-64 the extra make serve installs (MKL) means a real BLAS, and status says which.
        status = subprocess.run(
            [str(REPO / ".venv" / "bin" / "vllmmlxctl"), "--socket", str(work / "ctl.sock"), "status"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert status.returncode == 0, status.stderr
        header, row = status.stdout.splitlines()[:2]
        blas = dict(zip(header.split(), row.split()))["BLAS"]
        if sys.platform.startswith("linux") and platform.machine() == "x86_64":
            assert blas in ("mkl", "blis", "openblas"), status.stdout
            assert f"blas {blas}: /" in status.stdout
        # The gateway: the same model by name on one address, and the web page the README points at.
        assert "gateway: ready" in status.stdout and "(web page at /)" in status.stdout
        page = httpx.get(f"http://127.0.0.1:{gateway}/", timeout=10)
        assert page.status_code == 200 and "<title>" in page.text and "vllmmlxd" in page.text
        via = openai.OpenAI(base_url=f"http://127.0.0.1:{gateway}/v1", api_key="x", max_retries=0, timeout=300)
        assert via.completions.create(model="default", prompt="Paris is", max_tokens=3).model == "default"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
    assert "event=daemon.stopped" in log.read_text()
