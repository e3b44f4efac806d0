"""Pulls through the real huggingface_hub code path, in the real child process, against the stand-in hub
serving builtin:tiny's folder: progress, a cut connection resumed, a cancelled pull resumed with fewer
bytes, a checksum mismatch that installs nothing, disk admission, and the refusals."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.support.hub import StandInHub
from vllmmlxd.errors import StoreBusy, StoreError
from vllmmlxd.store.catalog import list_models
from vllmmlxd.store.layout import MARKER, store_copy, work_folder
from vllmmlxd.store.pulls import Pulls
from vllmmlxd.store.sources import Source
from vllmmlxd.store.weights import model_folder

REPO = "org/tiny"
WEIGHTS = "model.safetensors"


@pytest.fixture(scope="module")
def tiny(state_dir) -> Path:
    from vllmmlxd.engine.loading.builtin import ensure_builtin

    return ensure_builtin("tiny", state_dir)


@pytest.fixture
def hub(tiny, tmp_path, monkeypatch):
    with StandInHub() as hub:
        hub.add_folder(REPO, tiny)
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no token, no cache of the user's
        monkeypatch.delenv("HF_TOKEN", raising=False)
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        yield hub


def pull(state: Path, source: Source | None = None, during=None):
    """Run one pull to its end; every view its follower saw, and the final one."""
    source = source or Source(REPO)

    async def main():
        pulls = Pulls(state)
        p = pulls.start(source)
        seen = []
        watcher = asyncio.create_task(_collect(p, seen))
        if during is not None:
            await during(pulls, p)
        final = await asyncio.wait_for(p.wait(), 60)
        await watcher
        return seen, final

    return asyncio.run(main())


async def _collect(p, seen):
    async for view in p.follow():
        seen.append(view)


def test_a_pull_reports_its_progress_and_the_spec_then_loads_the_store_copy(hub, tiny, tmp_path):
    hub.faults.rate[WEIGHTS] = 12_000_000  # about a second: progress shows on the way
    seen, final = pull(tmp_path)
    assert final.state == "done" and final.error is None and not final.already, final
    # A follower sees each change, or the latest of those that came at once: steps in order, never back.
    order = ["resolving", "downloading", "verifying", "installing", "done"]
    steps = [order.index(v.state) for v in seen]
    assert steps == sorted(steps) and seen[0].state == "resolving" and seen[-1].state == "done"
    total = final.total_bytes
    assert total == sum(p.stat().st_size for p in tiny.iterdir() if p.is_file() and not p.name.startswith("."))
    midway = [v for v in seen if v.state == "downloading" and 0 < v.done_bytes < total]
    assert midway, [(v.state, v.done_bytes) for v in seen]
    assert any(v.bytes_per_s for v in midway) and final.percent == 100.0
    copy = store_copy(REPO, tmp_path)
    assert copy is not None and str(copy) == final.path and model_folder(REPO, tmp_path) == copy
    for name in ("config.json", WEIGHTS, "tokenizer.json"):
        assert (copy / name).read_bytes() == (tiny / name).read_bytes()
    assert json.loads((copy / MARKER).read_text())["commit"] == hub.repos[REPO].commit
    assert not work_folder(REPO, tmp_path).exists()  # moved into the store, not copied
    assert [m.name for m in list_models(tmp_path)] == [REPO]

    # Pulled again: that commit is there, nothing is downloaded.
    hub.reset_counts()
    _, again = pull(tmp_path)
    assert again.state == "done" and again.already and not [r for r in hub.requests if "/resolve/" in r[1]]


def test_a_connection_cut_midway_resumes_from_where_it_stopped(hub, tiny, tmp_path):
    size = (tiny / WEIGHTS).stat().st_size
    assert size > 11_600_000, "the cut must fall after huggingface_hub's first 10 MiB chunk"
    hub.faults.drop_after[WEIGHTS] = 11_500_000
    _, final = pull(tmp_path)
    assert final.state == "done", final
    ranges = [r for (method, path, r) in hub.requests if method == "GET" and path.endswith(WEIGHTS) and r]
    assert ranges == ["bytes=10485760-"]  # resumed at the last whole chunk written
    assert hub.served[WEIGHTS] < size + 1_100_000  # not fetched twice
    copy = store_copy(REPO, tmp_path)
    assert (
        hashlib.sha256((copy / WEIGHTS).read_bytes()).digest() == hashlib.sha256((tiny / WEIGHTS).read_bytes()).digest()
    )


def test_a_cancelled_pull_keeps_its_finished_files_and_the_next_fetches_fewer_bytes(hub, tiny, tmp_path):
    size = (tiny / WEIGHTS).stat().st_size
    hub.faults.rate[WEIGHTS] = 2_000_000

    async def cancel_midway(pulls, p):
        others = [n for n in hub.repos[REPO].files if n != WEIGHTS]
        work = work_folder(REPO, tmp_path)
        deadline = asyncio.get_running_loop().time() + 60
        # The small files served and renamed into place, the weights on their way.
        while not (all((work / n).is_file() for n in others) and hub.served[WEIGHTS] > 1_000_000):
            assert asyncio.get_running_loop().time() < deadline, (sorted(work.glob("*")), dict(hub.served))
            await asyncio.sleep(0.05)
        view = await pulls.cancel(p.id)
        assert view.state == "cancelled"

    _, first = pull(tmp_path, during=cancel_midway)
    assert first.state == "cancelled" and store_copy(REPO, tmp_path) is None
    partial = [m for m in list_models(tmp_path) if m.kind == "partial"]
    assert [m.name for m in partial] == [REPO]
    total_first = sum(hub.served.values())

    hub.faults.rate.clear()
    hub.reset_counts()
    seen, second = pull(tmp_path)
    assert second.state == "done" and store_copy(REPO, tmp_path) is not None
    # What the first pull finished counts as done from the start.
    assert all(v.done_bytes >= second.total_bytes - size for v in seen if v.state == "downloading")
    assert dict(hub.served) == {WEIGHTS: size}  # only the file it had not finished
    assert sum(hub.served.values()) < second.total_bytes and total_first < second.total_bytes


def test_a_checksum_mismatch_fails_clearly_and_installs_nothing(hub, tiny, tmp_path):
    hub.faults.corrupt.add(WEIGHTS)
    _, final = pull(tmp_path)
    assert final.state == "failed" and not final.refused
    assert final.error.startswith(f"checksum mismatch in {REPO}: {WEIGHTS} has sha256 ")
    assert "deleted it and installed nothing: pull again" in final.error
    assert store_copy(REPO, tmp_path) is None
    assert not [p for p in (tmp_path / "models").iterdir()]  # no half model, no staging folder
    assert not (work_folder(REPO, tmp_path) / WEIGHTS).exists()  # the bad file is gone: a pull fetches it anew

    hub.faults.corrupt.clear()
    hub.reset_counts()
    _, again = pull(tmp_path)
    assert again.state == "done" and dict(hub.served) == {WEIGHTS: (tiny / WEIGHTS).stat().st_size}


def test_a_pull_that_cannot_fit_the_disk_is_refused_before_it_downloads(hub, tmp_path):
    hub.faults.claimed_size[WEIGHTS] = 10**18
    _, final = pull(tmp_path)
    assert final.state == "failed" and final.refused
    assert re.fullmatch(
        rf"not enough disk space to pull {REPO}: it needs 1000000\.0 TB more in 4 files; \S+/downloads/hub has "
        r"[\d.]+ [kMGT]?B free, of which 1\.00 GB is kept free: free 99999\d\.\d TB or more and pull again",
        final.error,
    ), final.error
    assert not [r for r in hub.requests if "/resolve/" in r[1]]


def test_what_is_not_a_model_here_is_refused_with_a_reason(hub, tmp_path):
    hub.add("org/gguf-only", {"model.Q4_K_M.gguf": b"GGUF" * 100, "README.md": b"hi"})
    _, final = pull(tmp_path, Source("org/gguf-only"))
    assert final.state == "failed" and final.refused
    assert "org/gguf-only is not an MLX model folder" in final.error and "give its path as model" in final.error
    assert not final.missing
    _, final = pull(tmp_path, Source("org/none"))
    assert final.error == f"no model org/none on {hub.url} (a private one needs HF_TOKEN set for the daemon)"
    assert final.missing and not final.refused
    _, final = pull(tmp_path, Source(REPO, "v9"))
    assert final.error == f"{REPO} has no revision 'v9'" and final.missing


def test_a_hub_that_cannot_be_reached_is_said_so(tmp_path, monkeypatch):
    from tests.support.servers import free_port

    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    _, final = pull(tmp_path)
    assert final.state == "failed" and final.error.startswith(f"cannot reach {endpoint}: "), final.error
    assert not final.missing


def test_asking_again_joins_the_pull_under_way(hub, tmp_path):
    hub.faults.rate[WEIGHTS] = 4_000_000

    async def main():
        pulls = Pulls(tmp_path)
        first = pulls.start(Source(REPO))
        assert pulls.start(Source(REPO)) is first and pulls.running(REPO) is first
        with pytest.raises(StoreError, match=r"org/tiny is being pulled .*: wait for it, or cancel it"):
            pulls.start(Source(REPO, "v2"))
        await pulls.close()
        assert first.view().state == "cancelled" and pulls.running(REPO) is None

    asyncio.run(main())


def test_the_hub_token_never_shows_in_a_pulls_error(hub, tmp_path, monkeypatch, caplog):
    token = "hf_" + "s3cr3t" * 6
    monkeypatch.setenv("HF_TOKEN", token)
    hub.faults.refuse_key = True
    _, final = pull(tmp_path)
    assert final.state == "failed" and token not in repr(final) and token not in caplog.text
    assert final.error.startswith(f"{hub.url} answered: ") and "Bearer <token>" in final.error, final.error


def test_pulls_started_at_once_are_admitted_one_at_a_time_against_the_same_free_space(hub, tiny, tmp_path):
    # The finding: two 40 GB pulls admitted with 68.6 GB free. Each of these claims 60% of the room.
    room = shutil.disk_usage(tmp_path).free - 10**9
    hub.add_folder("org/twin", tiny)
    hub.faults.claimed_size[WEIGHTS] = int(0.6 * room)
    hub.faults.rate[WEIGHTS] = 1_000  # the admitted one is still downloading when the other is asked

    async def main():
        pulls = Pulls(tmp_path)
        both = [pulls.start(Source(REPO)), pulls.start(Source("org/twin"))]  # the same moment
        refused = await asyncio.wait_for(both[1].wait(), 60)
        first = both[0].view()
        await pulls.close()
        return first, refused

    first, refused = asyncio.run(main())
    assert first.state == "downloading" and first.total_bytes is not None, first
    assert refused.state == "failed" and refused.refused, refused
    assert "is promised to pulls running now" in refused.error, refused.error


def test_pulls_past_the_cap_wait_their_turn_and_past_the_queue_are_refused(hub, tiny, tmp_path):
    hub.faults.rate[WEIGHTS] = 4_000_000
    hub.add_folder("org/second", tiny)

    async def main():
        pulls = Pulls(tmp_path, max_running=1, max_queued=1)
        first = pulls.start(Source(REPO))
        second = pulls.start(Source("org/second"))
        assert first.view().state == "resolving" and second.view().state == "queued"
        with pytest.raises(
            StoreBusy, match=r"1 pulls are running and 1 waiting \(max_pulls: 1, max_waiting_pulls: 1\)"
        ):
            pulls.start(Source("org/third"))
        # The first's child has started and is downloading: the second's, had it not waited, would be there too.
        deadline = asyncio.get_running_loop().time() + 60
        while not (first.view().state == "downloading" and first.view().done_bytes > 0):
            assert asyncio.get_running_loop().time() < deadline and not first.view().ended, first.view()
            await asyncio.sleep(0.05)
        assert second.view().state == "queued" and second.proc is None  # no child while it waits
        await pulls.cancel(first.id)
        final = await asyncio.wait_for(second.wait(), 60)
        return final

    final = asyncio.run(main())
    assert final.state == "done", final


def test_a_queued_pull_can_be_cancelled_and_a_higher_cap_lets_waiting_pulls_go(hub, tiny, tmp_path):
    hub.faults.rate[WEIGHTS] = 1_000
    hub.add_folder("org/second", tiny)
    hub.add_folder("org/third", tiny)

    async def main():
        pulls = Pulls(tmp_path, max_running=1, max_queued=4)
        pulls.start(Source(REPO))
        second, third = pulls.start(Source("org/second")), pulls.start(Source("org/third"))
        assert (await pulls.cancel(second.id)).state == "cancelled"
        pulls.limit(2, 4)  # a reload raised max_pulls
        assert third.view().state == "resolving"
        await pulls.close()

    asyncio.run(main())
