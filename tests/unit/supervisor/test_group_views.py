"""Replica sets in the daemon's status: each set from its members' views, with their workers' load."""

from __future__ import annotations

from vllmmlxd.control.mapping import status_response
from vllmmlxd.supervisor.states import Shown
from vllmmlxd.supervisor.units import group_views
from vllmmlxd.supervisor.views import DaemonView, ModelView, StatusView


def view(name: str, state: Shown = "ready", group: str | None = "tiny", **runtime) -> ModelView:
    return ModelView(
        name=name,
        state=state,
        pid=None,
        host="127.0.0.1",
        port=8001,
        restarts=0,
        uptime_s=None,
        last_exit_code=None,
        served_model_name=name,
        last_error=None,
        runtime=runtime,
        group=group,
    )


def test_each_set_shows_its_members_states_and_load_in_the_configs_order():
    views = [view("a", running=2, waiting=1), view("solo", group=None), view("b", "backoff"), view("c", group="x")]
    groups = group_views(views)
    assert [(g.name, g.state) for g in groups] == [("tiny", "ready"), ("x", "ready")]
    assert [(m.name, m.state, m.running, m.waiting) for m in groups[0].members] == [
        ("a", "ready", 2, 1),
        ("b", "backoff", None, None),
    ]


def test_a_set_with_no_member_serving_shows_its_most_hopeful_member():
    assert group_views([view("a", "failed"), view("b", "starting")])[0].state == "starting"
    assert group_views([view("a", "failed"), view("b", "stopped")])[0].state == "failed"


def test_the_wire_carries_the_sets_and_each_models_group():
    daemon = DaemonView(pid=1, uptime_s=1.0, config_path="c", config_hash="h", last_reload=None, version="v")
    models = [view("a", running=0, waiting=0), view("b", "backoff")]
    wire = status_response(StatusView(daemon=daemon, models=models, groups=group_views(models)))
    assert [m.group for m in wire.models] == ["tiny", "tiny"]
    assert wire.groups[0].model_dump() == {
        "name": "tiny",
        "state": "ready",
        "members": [
            {"name": "a", "state": "ready", "running": 0, "waiting": 0},
            {"name": "b", "state": "backoff", "running": None, "waiting": None},
        ],
    }
