"""The model store on the real daemon, pulling builtin:tiny's folder from the stand-in hub: an entry with
``download: true`` shown downloading with its progress, then here; ``vllmmlxctl pull`` with its
progress, ``models`` and ``rm`` (refused while in use); a reload naming a model not downloaded is
refused with the pull to run; the pulled model served after a reload. Every decision on the way is
tested cheaper (tests/unit/store, tests/unit/supervisor/test_store_entries.py,
tests/integration/test_store_pull.py); this is the smoke test of the whole path."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.daemon import free_port, make_daemon, wait_gone
from tests.support.hub import StandInHub
from vllmmlxd.ctl.cli import main

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def hub(state_dir):
    from vllmmlxd.engine.loading.builtin import ensure_builtin

    tiny = ensure_builtin("tiny", state_dir)
    with StandInHub() as hub:
        hub.add_folder("org/tiny", tiny)
        hub.add_folder("org/tiny-dl", tiny)
        yield hub


@pytest.fixture
def daemon(tmp_path):
    d = make_daemon()
    for name in ("models", "downloads"):  # a store of its own: what it pulls must not outlive the test
        (d.state_dir / name).unlink()
        (d.state_dir / name).mkdir()
    yield d
    pids = d.worker_pids() if d.proc and d.proc.poll() is None else []
    code = d.stop()
    assert wait_gone(pids)
    if code not in (0, None):
        pytest.fail(f"daemon exited {code}:\n{d.log()[-3000:]}")


def entry(model: str, port: int, **extra) -> dict:
    return {"model": model, "port": port, **extra}


def chat(port: int) -> int:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    return httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=60).status_code


def ctl(daemon, capsys, *args: str) -> tuple[int, str, str]:
    """vllmmlxctl's own code, run in the test's process (a new interpreter per call costs seconds here)."""
    code = main(["--socket", str(daemon.socket), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_pull_list_remove_and_serve_from_the_store(daemon, hub, tmp_path, capsys):
    p_dl, p_pulled = free_port(), free_port()
    hub.faults.rate["model.safetensors"] = 6_000_000  # two seconds: status shows the download on its way
    # Lazy: its download is the point here, and one worker start (below) is enough for a smoke test.
    dl = entry("org/tiny-dl", p_dl, download=True, load="lazy")
    daemon.write({"dl": dl})
    daemon.start(env={"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""})

    # download: true: shown downloading with its progress, then here (a lazy entry waits unloaded).
    seen: list[float] = []

    def progress(models: dict) -> bool:
        if models["dl"]["state"] == "downloading" and models["dl"].get("download"):
            seen.append(models["dl"]["download"]["percent"] or 0)
        return models["dl"]["state"] == "unloaded"

    daemon.wait_for(progress, 60, "dl downloaded")
    assert any(0 < p < 100 for p in seen), seen
    assert "event=model.downloading model=dl repo=org/tiny-dl" in daemon.log()

    # vllmmlxctl pull as its own process, not on a terminal: plain progress lines, then where it went.
    hub.faults.rate.clear()
    pulled = daemon.ctl("pull", f"{hub.url}/org/tiny")  # the hub's URL works as the repo id
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.splitlines()[0] == "org/tiny: asking the hub for its files"
    assert "pulled org/tiny @ " in pulled.stdout
    assert "serve it with `model: org/tiny` in an entry, then `vllmmlxctl reload`" in pulled.stdout

    code, out, _ = ctl(daemon, capsys, "models", "--json")
    listed = {m["name"]: m for m in json.loads(out)["models"]}
    assert set(listed) == {"org/tiny", "org/tiny-dl"}
    assert listed["org/tiny-dl"]["used_by"] == ["dl"] and listed["org/tiny"]["used_by"] == []
    code, _, err = ctl(daemon, capsys, "rm", "org/tiny-dl")
    assert code == 1 and "org/tiny-dl is in use by dl" in err

    # A reload naming a model that is not here is refused, saying what to run.
    daemon.write({"dl": dl, "x": entry("org/absent", free_port())})
    code, _, err = ctl(daemon, capsys, "reload")
    assert code == 1 and "x: org/absent is not downloaded: run `vllmmlxctl pull org/absent` first" in err

    # The pulled model, served after a reload; then in use, it is not removed.
    daemon.write({"dl": dl, "p": entry("org/tiny", p_pulled)})
    code, out, err = ctl(daemon, capsys, "reload")
    assert code == 0, out + err
    daemon.wait_for(lambda ms: ms["p"]["state"] == "ready", 120, "p ready")
    assert chat(p_pulled) == 200
    code, _, err = ctl(daemon, capsys, "rm", "org/tiny")
    assert code == 1 and "org/tiny is in use by p" in err
