"""exit_reason: a dead worker's reason keeps its warnings, errors and tracebacks, not its routine lines."""

from __future__ import annotations

from tests.unit.supervisor.test_slot import FakeWorker, new_slot, run
from vllmmlxd.log import event_line
from vllmmlxd.supervisor.slot.exit_reason import exit_reason, tells_why

BLAS = "ts=2026-12-01T10:00:00.000 level=info event=blas.selected model=a blas=mkl threads=2"
FAILED = 'ts=2026-12-01T10:00:01.000 level=error event=model.load_failed model=a error="no such repo"'


def test_routine_lines_are_left_out():
    assert exit_reason(None, [BLAS, FAILED]) == FAILED
    assert exit_reason("did not become ready within 5s", [BLAS]) == "did not become ready within 5s"
    assert exit_reason(None, [BLAS]) == ""


def test_warnings_tracebacks_and_stray_prints_are_kept():
    warning = "level=warning event=blas.fallback model=a reason=x"
    wrapped = event_line("worker.stderr", "error", model="a", line="Traceback (most recent call last):")
    assert exit_reason(None, [BLAS, warning, wrapped, "Killed"]) == "\n".join([warning, wrapped, "Killed"])
    assert tells_why("<3>level=error event=x") and not tells_why("<6>level=info event=x")  # journald's form


def test_only_the_last_lines_are_kept():
    lines = [f"level=error event=e{i}" for i in range(15)]
    assert exit_reason(None, lines).splitlines() == lines[-10:]


class Chatty(FakeWorker):
    def last_lines(self, n=10):
        return "\n".join([BLAS, FAILED, "level=info event=worker.shutdown model=a"][-n:])


def test_a_failed_swap_reports_the_error_first(monkeypatch):
    from vllmmlxd.supervisor.slot import slot_workers as slot_workers_module

    monkeypatch.setattr(slot_workers_module, "WorkerProcess", Chatty)

    async def main():
        slot = new_slot()
        await slot.start()
        Chatty.script = [1]
        ok, error = await slot.replace(slot.config.model_copy(update={"prefill_step_size": 128}))
        assert not ok and error == FAILED
        await slot.shutdown()

    run(main())
