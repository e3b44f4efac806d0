"""diff.py: which entries a reload adds, removes, changes or leaves alone."""

from __future__ import annotations

from vllmmlxd.config.diff import LIVE_FIELDS, ReloadPlan, classify, diff_models, needs_new_worker
from vllmmlxd.config.schema import Config, ModelConfig, ResolvedModel, ResolvedUpstream


def make_config(daemon: dict | None = None, **models: dict) -> Config:
    entries = {
        name: {"model": "builtin:tiny", "port": 8000 + i, **fields} for i, (name, fields) in enumerate(models.items())
    }
    return Config.model_validate({"daemon": daemon or {}, "models": entries})


def test_first_load_adds_everything():
    plan = diff_models(None, make_config(b={}, a={}))
    assert plan == ReloadPlan(added=("a", "b"))
    assert not plan.is_empty


def test_added_removed_changed_unchanged():
    old = make_config(a={}, b={}, c={})
    new = make_config(a={}, b={"default_temperature": 0.2, "aliases": "x"}, d={})
    # Ports are assigned by position: d takes c's port, so compare entries by name, not address.
    plan = diff_models(old, new)
    assert plan.added == ("d",)
    assert plan.removed == ("c",)
    assert plan.changed == {"b": ("aliases", "default_temperature")}
    assert plan.unchanged == ("a",)
    assert plan.daemon_changed == ()


def test_identical_configs_are_a_no_op():
    plan = diff_models(make_config(a={"api_key": "k"}), make_config(a={"api_key": "k"}))
    assert plan.is_empty
    assert plan.unchanged == ("a",)
    assert plan.render() == "no changes\nunchanged: a"


def test_a_changed_secret_is_a_change_without_showing_it():
    plan = diff_models(make_config(a={"api_key": "old-secret"}), make_config(a={"api_key": "new-secret"}))
    assert plan.changed == {"a": ("api_key",)}
    assert "secret" not in plan.render() and "secret" not in repr(plan)


def test_adding_a_secret_is_a_change():
    assert diff_models(make_config(a={}), make_config(a={"api_key": "k"})).changed == {"a": ("api_key",)}


def test_daemon_fields_that_need_a_restart():
    old = make_config({"log_level": "info"}, a={})
    new = make_config({"log_level": "debug", "state_dir": "/tmp/x", "control_socket": "/tmp/x/c.sock"}, a={})
    plan = diff_models(old, new)
    assert plan.daemon_changed == ("control_socket", "log_level", "state_dir")
    assert plan.restart_required == ("control_socket", "state_dir")
    assert not plan.is_empty


def test_live_daemon_change_needs_no_restart():
    plan = diff_models(make_config({"log_level": "info"}), make_config({"log_level": "error", "drain_timeout": 5}))
    assert plan.daemon_changed == ("drain_timeout", "log_level")
    assert plan.restart_required == ()
    assert plan.render() == "daemon changed: drain_timeout, log_level"


def test_render_lists_each_nonempty_category():
    plan = ReloadPlan(
        added=("x",),
        removed=("z",),
        changed={"y": ("default_temperature", "port"), "w": ("host",)},
        unchanged=("a", "b"),
        daemon_changed=("state_dir",),
        restart_required=("state_dir",),
    )
    assert plan.render().splitlines() == [
        "added: x",
        "changed: y (default_temperature, port), w (host)",
        "  y: new worker (port; also default_temperature)",
        "  w: new worker (host)",
        "removed: z",
        "unchanged: a, b",
        "daemon changed: state_dir",
        "restart required: state_dir",
    ]


def test_render_of_an_empty_config():
    assert diff_models(Config(), Config()).render() == "no changes"


def test_live_keys_only_are_applied_live_and_say_which():
    old = make_config(a={}, b={}, c={})
    new = make_config(a={"timeout": 5, "api_key": "k"}, b={"max_num_seqs": 2, "rate_limit": 10}, c={})
    plan = diff_models(old, new)
    assert plan.live == ("a",) and plan.new_worker == ("b",)
    assert plan.changes["a"].kind == "apply live" and plan.changes["a"].forcing == ()
    assert plan.changes["b"].kind == "new worker" and plan.changes["b"].forcing == ("max_num_seqs",)
    assert plan.changed == {"a": ("api_key", "timeout"), "b": ("max_num_seqs", "rate_limit")}  # unchanged contract
    assert "  a: apply live (api_key, timeout)" in plan.render().splitlines()
    assert "  b: new worker (max_num_seqs; also rate_limit)" in plan.render().splitlines()
    assert {
        "name": "b",
        "kind": "new worker",
        "keys": ["max_num_seqs", "rate_limit"],
        "forcing": ["max_num_seqs"],
    } in plan.entries()
    assert {"name": "c", "kind": "unchanged", "keys": [], "forcing": []} in plan.entries()


def test_needs_new_worker_names_the_keys_that_force_it():
    base = ModelConfig(model="builtin:tiny")
    assert needs_new_worker(base, base.model_copy(update={"max_queue": 3, "aliases": ("x",)})) == (False, [])
    # The KV budget of running requests is read at each admission, as max_queue is.
    assert needs_new_worker(base, base.model_copy(update={"max_kv_memory_mb": 512.0})) == (False, [])
    assert needs_new_worker(base, base.model_copy(update={"port": 9000, "timeout": 3})) == (True, ["port"])
    assert needs_new_worker(base, base.model_copy(update={"model": "builtin:smollm2-135m-instruct"})) == (
        True,
        ["model"],
    )


def test_every_live_key_is_a_model_key_and_engine_keys_are_not_live():
    assert set(ResolvedModel.model_fields) | set(ResolvedUpstream.model_fields) >= LIVE_FIELDS
    for key in (
        "model",
        "host",
        "port",
        "blas",
        "threads",
        "continuous_batching",
        "max_num_seqs",
        "prefill_step_size",
        "cache_memory_mb",
        "cache_memory_percent",
        "reasoning_parser",
        "tool_call_parser",
        "trust_remote_code",
    ):
        assert not classify((key,)).live, key


def test_a_plan_built_by_hand_classifies_its_changes():
    plan = ReloadPlan(changed={"x": ("timeout",), "y": ("port",)})
    assert plan.live == ("x",) and plan.new_worker == ("y",)
