"""vllmmlxd as users install it: ``python -m build`` makes a wheel and an sdist that carry every
file of the package; the wheel, installed into new virtual environments outside the clone (as
``pip install vllmmlxd`` and ``pip install 'vllmmlxd[vision]'`` do), serves from there.

The environments are made with uv, which installs what pip would, from the same index, from the
cache the clone's own install filled: seconds, where pip takes minutes.
"""

from __future__ import annotations

import base64
import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import httpx
import pytest

import vllmmlxd
from tests.support.daemon import make_daemon, model_entry
from tests.support.servers import free_port, start_serve

ROOT = Path(__file__).resolve().parents[2]
UV = shutil.which("uv", path=str(Path(sys.executable).parent)) or shutil.which("uv") or ""
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not UV, reason="the clone's venv brings uv (Makefile)")]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    # The wheel is built from the sdist, as an index's users who build from source get it.
    subprocess.run(
        [sys.executable, "-m", "build", "--installer", "uv", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return out


def _only(folder: Path, pattern: str) -> Path:
    (found,) = folder.glob(pattern)
    return found


def _venv(where: Path, requirement: str) -> Path:
    """A new virtual environment at ``where`` with ``requirement`` installed; its bin folder."""
    subprocess.run([UV, "venv", "-q", "--python", sys.executable, str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    subprocess.run(
        [UV, "pip", "install", "-q", "--python", str(python), requirement], check=True, timeout=600, cwd=where
    )
    return where / "bin"


@pytest.fixture(scope="module")
def plain(dist, tmp_path_factory) -> Path:
    return _venv(tmp_path_factory.mktemp("installed") / "venv", str(_only(dist, "*.whl")))


def _tracked(prefix: str) -> set[str]:
    out = subprocess.run(["git", "ls-files", prefix], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="reads the clone's file list from git")
def test_the_wheel_and_the_sdist_carry_every_file_of_the_package(dist):
    package = _tracked("vllmmlxd")
    assert any(name.endswith(".jinja") for name in package) and "vllmmlxd/gateway/static/index.html" in package
    wheel = zipfile.ZipFile(_only(dist, "*.whl"))
    assert {n for n in wheel.namelist() if n.startswith("vllmmlxd/")} == package
    with tarfile.open(_only(dist, "*.tar.gz")) as sdist:
        top = f"vllmmlxd-{vllmmlxd.__version__}/"
        carried = {name.removeprefix(top) for name in sdist.getnames()}
    assert package | {"README.md", "CHANGELOG.md", "pyproject.toml", "config/default.yaml"} <= carried
    assert _tracked("config") | _tracked("service") <= carried

    meta = Parser().parsestr(wheel.read(f"vllmmlxd-{vllmmlxd.__version__}.dist-info/METADATA").decode())
    assert meta["Version"] == vllmmlxd.__version__
    assert {"vision", "linux-fast"} <= set(meta.get_all("Provides-Extra"))
    assert any(r.startswith("mlx-vlm==") and 'extra == "vision"' in r for r in meta.get_all("Requires-Dist"))
    scripts = wheel.read(f"vllmmlxd-{vllmmlxd.__version__}.dist-info/entry_points.txt").decode()
    assert "vllmmlxd = vllmmlxd.cli:main" in scripts and "vllmmlxctl = vllmmlxd.ctl.cli:main" in scripts


def test_the_installed_wheel_serves_a_model_and_its_own_vllmmlxctl_drives_it(plain):
    found = subprocess.run(
        [plain / "python", "-c", "import vllmmlxd; print(vllmmlxd.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=plain,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert Path(found.stdout.strip()).is_relative_to(plain.parent)  # the installed copy, not the clone's
    version = subprocess.run([plain / "vllmmlxd", "--version"], capture_output=True, text=True, cwd=plain)
    assert version.stdout.split()[:2] == ["vllmmlxd", vllmmlxd.__version__]

    daemon = make_daemon()
    daemon.bin = plain
    port = free_port()
    daemon.write({"tiny": model_entry(port)})
    daemon.start()
    try:
        daemon.wait_ready({"tiny"})
        health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()
        assert health["version"] == vllmmlxd.__version__ and health["commit"] is None  # no clone beside it
        chat = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
            timeout=60,
        )
        assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] > 0
        status = daemon.ctl("status")
        assert status.returncode == 0 and "tiny" in status.stdout, status.stderr
    finally:
        assert daemon.stop() == 0


def test_a_vision_model_without_the_vision_extra_names_the_extra(plain):
    port = free_port()
    proc = subprocess.run(
        [plain / "vllmmlxd", "serve", "builtin:tiny-vlm", "--port", str(port)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=plain,
    )
    assert proc.returncode != 0
    assert "needs vllmmlxd's 'vision' extra" in proc.stderr and "pip install 'vllmmlxd[vision]'" in proc.stderr


def test_the_vision_extra_serves_tiny_vlm(dist, tmp_path):
    from PIL import Image

    bin = _venv(tmp_path / "venv", f"{_only(dist, '*.whl')}[vision]")
    server = start_serve("builtin:tiny-vlm", bin=bin)
    try:
        png = io.BytesIO()
        Image.new("RGB", (32, 32), (200, 30, 30)).save(png, "PNG")
        image = {"url": "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()}
        content = [{"type": "image_url", "image_url": image}, {"type": "text", "text": "What colour?"}]
        chat = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": 4},
            timeout=120,
        )
        assert chat.status_code == 200, chat.text
        text_only = httpx.post(
            server.url + "/v1/chat/completions",
            json={"model": "default", "messages": [{"role": "user", "content": "What colour?"}], "max_tokens": 4},
            timeout=120,
        )
        assert chat.json()["usage"]["prompt_tokens"] > text_only.json()["usage"]["prompt_tokens"]  # the image's
    finally:
        server.stop()
