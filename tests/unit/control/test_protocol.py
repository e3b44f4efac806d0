"""protocol.py: wire models round-trip, keep the exact keys scripts read, and find the socket."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from vllmmlxd.control.protocol import (
    ActionResponse,
    DaemonStatus,
    ErrorResponse,
    LogsResponse,
    ModelStatus,
    ReloadResponse,
    ReloadResult,
    StatusResponse,
    control_socket_path,
)


def make_status() -> StatusResponse:
    return StatusResponse(
        daemon=DaemonStatus(
            pid=4121,
            uptime_s=192.5,
            config_path="/etc/vllmmlxd/config.yaml",
            config_hash="abc123def456",
            last_reload=ReloadResult(ok=True, at=1_700_000_000.0, plan="unchanged: llama"),
            version="0.1.0",
        ),
        models=[
            ModelStatus(
                name="llama",
                state="ready",
                pid=4200,
                host="127.0.0.1",
                port=8001,
                restarts=0,
                uptime_s=180.0,
                served_model_name="llama-3",
            ),
            ModelStatus(
                name="qwen",
                state="failed",
                host="127.0.0.1",
                port=8002,
                restarts=5,
                last_exit_code=1,
                served_model_name="qwen",
                last_error="Traceback\nMemoryError",
            ),
        ],
    )


def test_status_round_trips_through_json():
    status = make_status()
    assert StatusResponse.model_validate_json(status.model_dump_json()) == status


def test_status_json_has_exactly_the_documented_keys():
    data = json.loads(make_status().model_dump_json())
    assert set(data) == {"daemon", "models", "gateway", "groups", "pulls"}
    assert set(data["daemon"]) == {
        "pid",
        "uptime_s",
        "config_path",
        "config_hash",
        "last_reload",
        "version",
        "config_missing",
    }
    assert set(data["daemon"]["last_reload"]) == {"ok", "at", "error", "plan"}
    for model in data["models"]:
        assert set(model) == {
            "name",
            "state",
            "pid",
            "host",
            "port",
            "restarts",
            "uptime_s",
            "last_exit_code",
            "served_model_name",
            "last_error",
            "keys",
            "mcp",
            "embedding_model",
            "embedding_requests",
            "embedding_inputs",
            "vision",
            "speculative",
            "blas",
            "blas_path",
            "blas_warning",
            "threads",
            "cpus",
            "running",
            "waiting",
            "tokens_per_s",
            "cache_mb",
            "cache_budget_mb",
            "kv",
            "cache_disk_mb",
            "cache_disk_budget_mb",
            "load",
            "idle_unload_s",
            "idle_s",
            "upstream",
            "group",
            "distributed",
            "ranks",
            "download",
        }
    assert data["models"][1]["pid"] is None and data["models"][1]["uptime_s"] is None


def test_a_newer_daemons_extra_keys_are_kept():
    data = json.loads(make_status().model_dump_json())
    data["daemon"]["memory_mb"] = 512
    data["models"][0]["queue"] = 3
    again = StatusResponse.model_validate(data).model_dump(mode="json")
    assert again["daemon"]["memory_mb"] == 512
    assert again["models"][0]["queue"] == 3


def test_unknown_state_is_rejected():
    with pytest.raises(ValidationError):
        ModelStatus(name="x", state="sleeping", host="h", port=1, served_model_name="x")


@pytest.mark.parametrize(
    "model",
    [
        ReloadResponse(ok=False, dry_run=True, plan="", error="c.yaml:3:5: models.a.port: bad"),
        ActionResponse(ok=True, name="llama", message="restarted"),
        LogsResponse(lines=["one", "two"]),
        ErrorResponse(error="no model named 'x'; models: a, b"),
        ReloadResult(ok=False, at=1.5, error="boom"),
    ],
)
def test_small_models_round_trip(model):
    assert type(model).model_validate_json(model.model_dump_json()) == model


def test_control_socket_path_prefers_the_config_socket(tmp_path):
    assert control_socket_path(tmp_path / "c.sock", tmp_path / "state") == tmp_path / "c.sock"


def test_control_socket_path_uses_the_state_dir(tmp_path):
    assert control_socket_path(None, tmp_path) == tmp_path / "control.sock"


def test_control_socket_path_defaults_to_the_resolved_state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLMMLXD_STATE_DIR", str(tmp_path))
    assert control_socket_path() == tmp_path / "control.sock"


def test_control_socket_path_expands_the_home_dir():
    assert control_socket_path("~/x.sock") == Path.home() / "x.sock"


def test_the_wire_states_are_the_supervisors():
    from typing import get_args

    from vllmmlxd.control.protocol import State
    from vllmmlxd.supervisor import states

    assert get_args(State) == states.SHOWN


def test_a_pulls_status_has_exactly_the_documented_keys():
    from vllmmlxd.control.protocol import PullStatus, StoredModelStatus

    status = PullStatus(id="p1", repo="org/m", state="downloading")
    assert set(json.loads(status.model_dump_json())) == {
        "id",
        "repo",
        "revision",
        "state",
        "commit",
        "total_bytes",
        "done_bytes",
        "files",
        "percent",
        "bytes_per_s",
        "eta_s",
        "started_at",
        "ended_at",
        "error",
        "refused",
        "missing",
        "path",
        "already",
    }
    stored = StoredModelStatus(name="org/m", kind="pulled", source="", path="/s", size_bytes=1)
    assert set(json.loads(stored.model_dump_json())) == {
        "name",
        "kind",
        "source",
        "path",
        "size_bytes",
        "revision",
        "commit",
        "created",
        "used_by",
    }


def test_the_pull_view_and_the_wire_status_carry_the_same_fields():
    import dataclasses

    from vllmmlxd.control.protocol import PullStatus, StoredModelStatus
    from vllmmlxd.store.catalog import StoredModel
    from vllmmlxd.store.pulls import PullView

    assert [f.name for f in dataclasses.fields(PullView)] == list(PullStatus.model_fields)
    assert [f.name for f in dataclasses.fields(StoredModel)] == list(StoredModelStatus.model_fields)
