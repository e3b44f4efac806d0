"""Entries on a hub model that is not here: refused with the pull to run (at start the entry waits,
failed; a reload that adds one changes nothing), or, with ``download: true``, downloaded by the daemon
(shown ``downloading`` with its progress) and started once it is here. The supervisor's task over fake
workers; the pulls are real (their child process against the stand-in hub)."""

from __future__ import annotations

import json

import pytest

from tests.support.fake_worker import FakeWorker
from tests.support.hub import StandInHub
from tests.unit.supervisor.test_supervisor import (  # noqa: F401
    entry,
    fake_workers,
    make,
    run,
    state,
    until,
    with_memory,
    write,
)
from vllmmlxd.store.layout import MARKER, folder_name
from vllmmlxd.supervisor import states

REPO = "org/tiny"


@pytest.fixture
def hub(state_dir, tmp_path, monkeypatch):
    from vllmmlxd.engine.loading.builtin import ensure_builtin

    with StandInHub() as hub:
        hub.add_folder(REPO, ensure_builtin("tiny", state_dir))
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield hub


@pytest.fixture(autouse=True)
def no_hub_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))  # only the store counts as downloaded here


def pulled(tmp_path, repo: str) -> None:
    """Put ``repo`` in the store as a finished pull leaves it."""
    folder = tmp_path / "models" / folder_name(repo)
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / MARKER).write_text(json.dumps({"repo": repo}))


def test_an_entry_whose_model_is_not_downloaded_waits_failed_and_says_what_to_run(tmp_path):
    async def main():
        sup = make(tmp_path, {"q": entry(model="org/absent"), "t": entry()})
        await sup.start_all()
        assert state(sup, "t") == states.READY and state(sup, "q") == states.FAILED
        view = next(m for m in sup.status().models if m.name == "q")
        assert view.last_error == (
            "org/absent is not downloaded: run `vllmmlxctl pull org/absent`, then `vllmmlxctl start q` "
            "(or set download: true on q to have the daemon download it)"
        )
        assert [w.config.model for w in FakeWorker.spawned] == ["builtin:tiny"]  # no worker tried it
        reply = await sup.start("q")
        assert not reply.ok and reply.message == view.last_error and len(FakeWorker.spawned) == 1

        pulled(tmp_path, "org/absent")  # `vllmmlxctl pull org/absent` done
        assert (await sup.start("q")).ok and state(sup, "q") == states.READY
        await sup.stop_all()

    run(main())


def test_a_reload_adding_an_entry_on_a_model_not_downloaded_changes_nothing(tmp_path):
    async def main():
        sup = make(tmp_path, {"t": entry()})
        await sup.start_all()
        write(tmp_path / "config.yaml", {"t": entry(), "q": entry(model="org/absent")})
        reply = await sup.reload()
        assert not reply.ok and set(sup.units) == {"t"}
        assert reply.error == (
            "q: org/absent is not downloaded: run `vllmmlxctl pull org/absent` first (or set download: true on q)"
        )
        assert sup.last_reload is not None and not sup.last_reload.ok
        await sup.stop_all()

    run(main())


def test_a_model_pulled_after_the_start_is_served_at_the_next_reload(tmp_path):
    async def main():
        sup = make(tmp_path, {"q": entry(model="org/absent")})
        await sup.start_all()
        assert state(sup, "q") == states.FAILED
        pulled(tmp_path, "org/absent")
        reply = await sup.reload()  # the same config: the entry's model is here now
        assert reply.ok, reply.error
        await until(lambda: state(sup, "q") == states.READY)
        await sup.stop_all()

    run(main())


def test_download_true_downloads_shows_progress_then_starts(tmp_path, hub):
    hub.faults.rate["model.safetensors"] = 8_000_000  # a second and a half: progress shows

    async def main():
        sup = make(tmp_path, {"q": entry(model=REPO, download=True)})
        await sup.start_all()
        assert state(sup, "q") == states.DOWNLOADING and not FakeWorker.spawned
        reply = await sup.load("q")
        assert not reply.ok and reply.message.startswith("model q is not here yet (downloading org/tiny")
        await until(lambda: (sup.status().models[0].download.percent or 0) > 0, timeout=20)
        view = sup.status().models[0]
        assert view.state == states.DOWNLOADING and 0 < view.download.percent < 100, view.download
        assert sup.shown("q")[1].startswith(f"downloading {REPO}: ") and "% of " in sup.shown("q")[1]
        assert [p.repo for p in sup.status().pulls] == [REPO]
        await until(lambda: state(sup, "q") == states.READY, timeout=30)
        assert [w.config.model for w in FakeWorker.spawned] == [REPO]
        assert sup.status().models[0].download is None
        await sup.stop_all()

    run(main())


def test_a_failed_download_shows_why_and_a_start_downloads_again(tmp_path, hub):
    hub.faults.corrupt.add("model.safetensors")

    async def main():
        sup = make(tmp_path, {"q": entry(model=REPO, download=True, load="lazy")})
        await sup.start_all()
        await until(lambda: state(sup, "q") == states.FAILED, timeout=30)
        assert sup.shown("q")[1].startswith(f"the download of {REPO} failed: checksum mismatch in {REPO}")
        hub.faults.corrupt.clear()
        reply = await sup.start("q")
        assert not reply.ok and state(sup, "q") == states.DOWNLOADING
        await until(lambda: state(sup, "q") == states.UNLOADED, timeout=30)  # lazy: here, and loads on demand
        assert (await sup.load("q")).ok and [w.config.model for w in FakeWorker.spawned] == [REPO]
        await sup.stop_all()

    run(main())


def test_a_serving_entry_changed_to_a_model_not_here_keeps_serving_until_it_is_then_swaps(tmp_path, hub):
    hub.faults.rate["model.safetensors"] = 8_000_000

    async def main():
        first = entry()
        sup = make(tmp_path, {"q": first})
        await sup.start_all()
        old = FakeWorker.spawned[0]
        write(tmp_path / "config.yaml", {"q": {**first, "model": REPO, "download": True}})
        reply = await sup.reload()
        assert not reply.ok and reply.error.startswith(f"q: downloading {REPO} first")
        assert state(sup, "q") == states.READY and old.alive  # serving the old model meanwhile
        await until(lambda: sup.last_reload.ok and state(sup, "q") == states.READY, timeout=30)
        assert [w.config.model for w in FakeWorker.spawned] == ["builtin:tiny", REPO] and not old.alive
        await sup.stop_all()

    run(main())


def test_a_downloaded_model_is_started_through_memory_admission(tmp_path, hub, caplog):
    async def main():
        sup = make(tmp_path, {"q": entry(model=REPO, download=True)})
        with_memory(sup, usable_mb=1000, each_mb=4000)  # its real size, known once it is here, does not fit
        await sup.start_all()
        await until(lambda: state(sup, "q") == states.STOPPED, timeout=30)
        await sup.stop_all()

    run(main())
    assert not FakeWorker.spawned
    refused = [r for r in caplog.records if getattr(r, "event", None) == "memory.load_refused"]
    assert refused and "not enough memory" in refused[0].fields["error"]
