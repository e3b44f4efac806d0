"""watcher.py: one reload per settled new content, a deleted file reported, a failing reload survived."""

from __future__ import annotations

import asyncio
import os

from vllmmlxd.supervisor.watcher import file_hash, watch_config


def test_reloads_survive_failures_and_a_deletion_is_reported(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("one\n")
    running = {file_hash(path)}
    reloads: list[str] = []
    missing: list[bool] = []

    async def reload():
        reloads.append(path.read_text())
        if len(reloads) == 1:
            raise RuntimeError("a bug in the reload")

    def save(text: str) -> None:
        tmp = tmp_path / "config.tmp"
        tmp.write_text(text)
        os.replace(tmp, path)

    async def until(predicate, timeout=10.0):
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate():
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)

    async def main():
        stop = asyncio.Event()
        task = asyncio.create_task(
            watch_config(path, lambda d: d in running, reload, stop, on_missing=missing.append, settle_ms=100)
        )
        await asyncio.sleep(0.3)  # its watch starts (the OS's, in watchfiles): a head start, not a proof
        save("two\n")
        await until(lambda: reloads == ["two\n"])
        # A burst: one reload, of the last content. The saves never yield to the loop, so no gap
        # between two of them outlasts the settle time, however loaded the machine (with a sleep
        # between saves, a starved loop made two bursts of one, rightly reloaded twice).
        for i in range(10):
            save(f"three {i}\n")
        await until(lambda: len(reloads) == 2)
        assert reloads[1:] == ["three 9\n"]
        path.unlink()
        await until(lambda: missing == [True])
        save("three 9\n")  # back as it was: no reload
        await until(lambda: missing == [True, False])
        # A marker, not a sleep: changes are handled in order, so a reload the burst or the restore
        # caused would come before the marker's.
        save("four\n")
        await until(lambda: reloads[-1] == "four\n")
        assert reloads == ["two\n", "three 9\n", "four\n"]  # the burst was one reload, the restore none
        stop.set()
        await asyncio.wait_for(task, 5)

    asyncio.run(main())


def test_a_crashed_reloads_validation_error_is_logged_without_its_input_values():
    from pydantic import ValidationError

    from vllmmlxd.config.schema import ModelConfig
    from vllmmlxd.supervisor.watcher import _without_values

    try:
        ModelConfig.model_validate({"model": "x", "port": "sk-secret-in-the-wrong-place"})
    except ValidationError as exc:
        text = _without_values(exc)
    assert text.startswith("ValidationError: port: ") and "sk-secret" not in text
    assert _without_values(OSError("disk full")) == "OSError: disk full"
