import logging

from vllmmlxd.log import LogfmtFormatter, format_fields, log_event


def record(event="worker.ready", level=logging.INFO, **fields):
    r = logging.LogRecord("x", level, __file__, 1, event, None, None)
    r.event, r.fields = event, fields
    return r


def test_logfmt_line_has_level_event_and_fields():
    line = LogfmtFormatter(static={"model": "llama"}).format(record(pid=42, port=8001))
    assert line.startswith("ts=")
    assert "level=info event=worker.ready model=llama pid=42 port=8001" in line


def test_values_with_spaces_are_quoted():
    assert format_fields({"error": 'bad "thing" here', "n": None}) == 'error="bad \\"thing\\" here"'


def test_journald_lines_carry_a_priority_and_no_timestamp():
    line = LogfmtFormatter(journald=True).format(record(level=logging.ERROR))
    assert line.startswith("<3>level=error event=worker.ready")
    assert "ts=" not in line


def test_log_event_passes_fields(caplog):
    logger = logging.getLogger("vllmmlxd.test")
    with caplog.at_level(logging.INFO):
        log_event(logger, "thing.done", seconds=1.5)
    assert caplog.records[0].fields == {"seconds": 1.5}


def test_event_line_matches_the_formatter(monkeypatch):
    from vllmmlxd.log import event_line

    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    assert " level=warning event=worker.backoff model=a retry_in_s=0.5" in event_line(
        "worker.backoff", "warning", model="a", retry_in_s=0.5
    )
    monkeypatch.setenv("JOURNAL_STREAM", "8:123")
    assert event_line("worker.failed", "error", model="a") == "<3>level=error event=worker.failed model=a"


def test_control_characters_in_values_are_escaped_never_raw():
    line = format_fields(
        {"id": "a\nlevel=error event=forged", "t": "x\x1b[31mred\r\x07", "sep": "p\u2028q", "c1": "\x9b"}
    )
    assert "\n" not in line and "\x1b" not in line and "\r" not in line and "\x07" not in line
    assert "\u2028" not in line and "\x9b" not in line
    assert 'id="a\\nlevel=error event=forged"' in line
    assert 't="x\\x1b[31mred\\r\\x07"' in line and 'sep="p\\u2028q"' in line and 'c1="\\x9b"' in line


def test_uvicorns_routine_lines_are_server_events_and_its_warnings_keep_their_name():
    def uvicorn_record(level):
        return logging.LogRecord("uvicorn.error", level, __file__, 1, "Started server process [1]", None, None)

    assert "event=server " in LogfmtFormatter().format(uvicorn_record(logging.INFO))
    assert "event=uvicorn.error " in LogfmtFormatter().format(uvicorn_record(logging.WARNING))
