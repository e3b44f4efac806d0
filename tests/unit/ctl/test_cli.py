"""vllmmlxctl against a real control server on a Unix socket (fed by a fake supervisor)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.control import ControlThread, FakeTarget, model_status, short_tmp_dir
from vllmmlxd.control.protocol import ReloadResponse, ReloadResult
from vllmmlxd.ctl import exit_codes
from vllmmlxd.ctl.cli import main
from vllmmlxd.ctl.client import ControlClient, resolve_socket

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def target() -> FakeTarget:
    return FakeTarget()


@pytest.fixture
def sock_dir():
    with short_tmp_dir() as d:
        yield d


@pytest.fixture
def daemon(target, sock_dir):
    with ControlThread(target, sock_dir / "run" / "control.sock") as running:
        yield running


def ctl(daemon, capsys, *args: str) -> tuple[int, str, str]:
    code = main(["--socket", str(daemon.path), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_status_all_ready_exits_0_with_table_and_footer(daemon, capsys):
    code, out, _ = ctl(daemon, capsys, "status")
    assert code == exit_codes.OK
    lines = out.splitlines()
    assert lines[0].split() == [
        "MODEL",
        "STATE",
        "PID",
        "PORT",
        "KEYS",
        "UPTIME",
        "RESTARTS",
        "RUN",
        "WAIT",
        "TOK/S",
        "CACHE",
        "BLAS",
        "THREADS",
        "CPUS",
    ]
    assert lines[1].split() == ["a", "ready", "4200", "8001", "open", "3m12s", "0", "-", "-", "-", "-", "-", "-", "-"]
    assert "last reload: ok at " in out


def test_status_with_a_failed_model_exits_3_and_shows_why(daemon, target, capsys):
    target.models = [
        model_status("a"),
        model_status(
            "b", "failed", pid=None, uptime_s=None, last_exit_code=1, last_error="Traceback\nMemoryError: out of memory"
        ),
    ]
    code, out, _ = ctl(daemon, capsys, "status")
    assert code == exit_codes.NOT_READY
    assert "b failed (exit 1):\n    Traceback\n    MemoryError: out of memory" in out


def test_status_json_prints_the_documented_keys(daemon, target, capsys):
    target.models = [model_status("a"), model_status("b", "starting")]
    code, out, _ = ctl(daemon, capsys, "status", "--json")
    assert code == exit_codes.NOT_READY
    data = json.loads(out)
    assert {"pid", "uptime_s", "config_path", "config_hash", "last_reload"} <= set(data["daemon"])
    assert {"ok", "at", "error"} <= set(data["daemon"]["last_reload"])
    keys = {"name", "state", "pid", "host", "port", "restarts", "uptime_s", "last_exit_code", "served_model_name"}
    assert all(keys <= set(m) for m in data["models"])
    assert [m["state"] for m in data["models"]] == ["ready", "starting"]


def test_status_shows_a_failed_reload(daemon, target, capsys):
    target.last_reload = ReloadResult(ok=False, at=1_700_000_000.0, error="/etc/v.yaml:4:11: models.a.port: bad")
    _, out, _ = ctl(daemon, capsys, "status")
    assert "last reload: FAILED at " in out and ": /etc/v.yaml:4:11: models.a.port: bad" in out


def test_reload_prints_the_plan(daemon, target, capsys):
    code, out, _ = ctl(daemon, capsys, "reload")
    assert code == exit_codes.OK
    assert out == "reloaded:\n    changed: a (port)\n    unchanged: b\n"
    assert target.calls == [("reload", False)]


def test_reload_dry_run_only_asks_for_the_plan(daemon, target, capsys):
    code, out, _ = ctl(daemon, capsys, "reload", "--dry-run")
    assert code == exit_codes.OK
    assert out.startswith("would apply:\n")
    assert target.calls == [("reload", True)]


def test_failed_reload_exits_1_with_file_line_col(daemon, target, capsys):
    error = "/etc/v.yaml:3:11: models.a.port: Input should be less than or equal to 65535"
    target.reload_response = ReloadResponse(ok=False, dry_run=False, plan="", error=error)
    code, out, err = ctl(daemon, capsys, "reload")
    assert code == exit_codes.ERROR
    assert out == ""
    assert error in err.splitlines()


def test_restart_a_model(daemon, target, capsys):
    code, out, _ = ctl(daemon, capsys, "restart", "a")
    assert (code, out) == (exit_codes.OK, "a: restart done\n")
    assert target.calls == [("restart", "a")]


@pytest.mark.parametrize("verb", ["restart", "stop", "start"])
def test_an_unknown_model_exits_1_naming_the_models(daemon, capsys, verb):
    code, _, err = ctl(daemon, capsys, verb, "nope")
    assert code == exit_codes.ERROR
    assert err == "vllmmlxctl: no model named 'nope'; models: a, b\n"


def test_a_failed_action_exits_1(daemon, target, capsys):
    target.action_ok = False
    code, _, err = ctl(daemon, capsys, "start", "b")
    assert code == exit_codes.ERROR
    assert "start b failed: did not become ready" in err


def test_logs_prints_the_last_n_lines(daemon, capsys):
    code, out, _ = ctl(daemon, capsys, "logs", "a", "-n", "3")
    assert (code, out) == (exit_codes.OK, "line 7\nline 8\nline 9\n")


def test_logs_of_an_unknown_model(daemon, capsys):
    code, _, err = ctl(daemon, capsys, "logs", "nope")
    assert code == exit_codes.ERROR and "no model named 'nope'" in err


def test_logs_follow_prints_the_backlog_then_new_lines(daemon, capsys):
    code, out, _ = ctl(daemon, capsys, "logs", "a", "-n", "2", "-f")
    assert (code, out) == (exit_codes.OK, "line 8\nline 9\nnew 1\nnew 2\n")


def test_logs_follow_ends_quietly_on_ctrl_c(daemon, capsys, monkeypatch):
    def interrupted(self, name, lines):
        yield "first"
        raise KeyboardInterrupt

    monkeypatch.setattr(ControlClient, "follow", interrupted)
    code, out, err = ctl(daemon, capsys, "logs", "a", "-f")
    assert (code, out, err) == (exit_codes.OK, "first\n", "")


def test_a_client_that_leaves_a_follow_closes_the_targets_stream(daemon, target):
    target.follow_forever = True
    with ControlClient(daemon.path) as client:
        lines = client.follow("a", 0)
        assert next(lines) == "new 1"
        lines.close()
    assert target.follow_closed.wait(5)


def test_the_socket_is_0600_in_a_0700_dir(daemon):
    assert daemon.path.is_socket()
    assert daemon.path.stat().st_mode & 0o777 == 0o600
    assert daemon.path.parent.stat().st_mode & 0o777 == 0o700


def test_the_socket_is_removed_on_stop(target, sock_dir):
    with ControlThread(target, sock_dir / "c.sock") as running:
        assert running.path.exists()
    assert not running.path.exists()


def test_options_work_after_the_command_and_from_the_environment(daemon, capsys, monkeypatch):
    assert main(["status", "--socket", str(daemon.path)]) == exit_codes.OK
    monkeypatch.setenv("VLLMMLXD_SOCKET", str(daemon.path))
    assert main(["status"]) == exit_codes.OK
    capsys.readouterr()


def test_unreachable_daemon_exits_4(sock_dir, capsys):
    missing = sock_dir / "none.sock"
    code = main(["--socket", str(missing), "status"])
    err = capsys.readouterr().err
    assert code == exit_codes.UNREACHABLE
    assert err == (
        f"vllmmlxctl: cannot reach the daemon at {missing}: No such file or directory (is vllmmlxd running?)\n"
        "vllmmlxctl: (that socket is --socket) check the path, or pass --config FILE (the daemon's config) to find its socket\n"
    )


def test_unreachable_by_default_says_so_and_suggests_config_or_socket(sock_dir, capsys, monkeypatch):
    monkeypatch.delenv("VLLMMLXD_SOCKET", raising=False)
    monkeypatch.setenv("VLLMMLXD_STATE_DIR", str(sock_dir / "state"))
    assert main(["status"]) == exit_codes.UNREACHABLE
    err = capsys.readouterr().err
    assert f"cannot reach the daemon at {sock_dir / 'state' / 'control.sock'}" in err
    assert "(that socket is the default)" in err and "--config FILE or --socket PATH" in err
    config = sock_dir / "c.yaml"
    config.write_text(f"daemon:\n  control_socket: {sock_dir}/d.sock\n")
    assert main(["--config", str(config), "status"]) == exit_codes.UNREACHABLE
    assert f"(that socket is the daemon section of {config})" in capsys.readouterr().err


def test_a_stale_socket_file_is_unreachable_too(sock_dir, capsys):
    stale = sock_dir / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))  # bound, never listening: what a killed daemon leaves
    assert main(["--socket", str(stale), "reload"]) == exit_codes.UNREACHABLE
    assert "Connection refused (is vllmmlxd running?)" in capsys.readouterr().err


def test_socket_discovery_order(tmp_path, monkeypatch):
    with_socket = tmp_path / "a.yaml"
    with_socket.write_text(f"daemon:\n  control_socket: {tmp_path}/cfg.sock\n  state_dir: {tmp_path}/s\n")
    with_state = tmp_path / "b.yaml"
    with_state.write_text(
        f"daemon:\n  state_dir: {tmp_path}/s\nmodels:\n  a:\n    model: x\n    api_key: ${{env:UNSET_KEY_4242}}\n"
    )
    env = {"VLLMMLXD_SOCKET": str(tmp_path / "env.sock")}
    assert str(resolve_socket("/x.sock", str(with_socket), env)) == "/x.sock"
    assert resolve_socket(None, str(with_socket), env) == tmp_path / "env.sock"
    assert resolve_socket(None, str(with_socket), {}) == tmp_path / "cfg.sock"
    # The daemon's secrets need not be set here just to find its socket.
    assert resolve_socket(None, str(with_state), {}) == tmp_path / "s" / "control.sock"
    monkeypatch.setenv("VLLMMLXD_STATE_DIR", str(tmp_path / "default"))
    assert resolve_socket(None, None, {}) == tmp_path / "default" / "control.sock"


def test_an_unreadable_config_for_discovery_is_an_error(tmp_path, capsys):
    code = main(["--config", str(tmp_path / "missing.yaml"), "status"])
    assert code == exit_codes.ERROR
    assert "missing.yaml: cannot read: No such file or directory" in capsys.readouterr().err


@pytest.fixture
def sixteen_gib(monkeypatch):
    from vllmmlxd.runtime import memory

    monkeypatch.setattr(memory, "read_machine_memory", lambda: memory.MachineMemory(16 << 30, "MemTotal"))


def test_check_a_good_config_prints_its_memory_plan(tmp_path, capsys, sixteen_gib):
    path = tmp_path / "good.yaml"
    path.write_text(
        "models:\n  a:\n    model: builtin:tiny\n    port: 8001\n  b:\n    model: builtin:tiny\n    port: 8002\n"
    )
    assert main(["check", str(path)]) == exit_codes.OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"{path}: ok (2 models: a, b)"
    assert lines[1].startswith("memory: ") and lines[1].endswith(
        "needed, 14,336 MB usable (16,384 MB physical (MemTotal) - 2,048 MB reserve): fits"
    )
    assert lines[2].startswith("  a: ") and "3,276 MB cache (20% of physical) + 200 MB worker" in lines[2]


def test_check_says_which_models_are_not_downloaded(tmp_path, capsys, sixteen_gib, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf"))
    path = tmp_path / "hub.yaml"
    path.write_text(
        f"daemon: {{state_dir: {tmp_path}}}\nmodels:\n  a: {{model: org/absent, port: 8001}}\n"
        "  b: {model: org/other, port: 8002, download: true}\n  c: {upstream: 'http://h:1'}\n"
    )
    assert main(["check", str(path)]) == exit_codes.OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[-2:] == [
        "a: org/absent is not downloaded: run `vllmmlxctl pull org/absent` (or set download: true on a)",
        "b: org/other is not downloaded yet: the daemon downloads it (download: true)",
    ]


def test_check_refuses_a_config_whose_models_do_not_fit(tmp_path, capsys, sixteen_gib):
    path = tmp_path / "big.yaml"
    path.write_text("models:\n  a:\n    model: builtin:tiny\n    cache_memory_mb: 10000000\n")
    assert main(["check", str(path)]) == exit_codes.ERROR
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{path}: refused: not enough memory: the models need 10,000,")
    assert "14,336 MB usable" in err and "  a: 10,000," in err and "10,000,000 MB cache (cache_memory_mb)" in err


def test_check_a_bad_config_names_file_line_col(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(
        textwrap.dedent("""\
        models:
          a:
            model: builtin:tiny
            port: 99999
    """)
    )
    assert main(["check", str(path)]) == exit_codes.ERROR
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:4:11: models.a.port: ")


def test_check_a_missing_file(tmp_path, capsys):
    assert main(["check", str(tmp_path / "nope.yaml")]) == exit_codes.ERROR
    assert "nope.yaml: no such file" in capsys.readouterr().err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == exit_codes.USAGE
    capsys.readouterr()


def test_install_service_print_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = tmp_path / "c.yaml"
    config.write_text("models: {}\n")
    code = main(["install-service", "--systemd", "--user", "--config", str(config), "--print"])
    out, err = capsys.readouterr()
    assert code == exit_codes.OK
    assert "[Service]" in out and f"run --config {config}" in out
    assert "systemctl --user enable --now vllmmlxd" in err
    assert not (tmp_path / ".config").exists()


def test_a_user_service_defaults_to_the_users_config(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VLLMMLXD_SOCKET", str(tmp_path / "no-daemon.sock"))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    assert main(["install-service", "--systemd", "--user", "--print"]) == exit_codes.OK
    out, err = capsys.readouterr()
    assert f"run --config {tmp_path / 'cfg' / 'vllmmlxd' / 'config.yaml'}" in out
    assert "does not exist yet" in err
    assert "(the default for a user service)" in err


def test_install_service_takes_the_running_daemons_config_and_says_so(daemon, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("VLLMMLXD_SOCKET", str(daemon.path))
    assert main(["install-service", "--systemd", "--user", "--print"]) == exit_codes.OK
    out, err = capsys.readouterr()
    assert "run --config /etc/v.yaml" in out  # the fake daemon's config_path
    lines = err.splitlines()
    said = lines.index("# it runs the config /etc/v.yaml (the running daemon's)")
    assert said < next(i for i, line in enumerate(lines) if "systemctl" in line)


def test_reload_dry_run_of_a_file_sends_its_absolute_path(daemon, target, capsys, tmp_path, monkeypatch):
    edited = tmp_path / "edited.yaml"
    edited.write_text("models: {}\n")
    monkeypatch.chdir(tmp_path)
    seen = []
    real = ControlClient.reload

    def reload(self, dry_run=False, file=None):
        seen.append(file)
        return real(self, dry_run=dry_run, file=file)

    monkeypatch.setattr(ControlClient, "reload", reload)
    # The fake daemon does not know the parameter: it answers for its own file, and ctl says so.
    code, out, err = ctl(daemon, capsys, "reload", "--dry-run", "edited.yaml")
    assert seen == [str(edited)] and code == exit_codes.ERROR
    assert "cannot preview another file" in err and out == ""
    # A daemon that reads the file says which one it read, and per entry what applies how.
    target.reload_response = ReloadResponse(
        ok=True,
        dry_run=True,
        plan="memory: ok",
        config_path=str(edited),
        entries=[
            {"name": "a", "kind": "apply live", "keys": ["rate_limit", "timeout"], "forcing": []},
            {"name": "b", "kind": "new worker", "keys": ["port", "timeout"], "forcing": ["port"]},
            {"name": "c", "kind": "unchanged", "keys": [], "forcing": []},
        ],
    )
    code, out, _ = ctl(daemon, capsys, "reload", "--dry-run", str(edited))
    assert code == exit_codes.OK
    assert out.splitlines() == [
        f"would apply {edited}:",
        "    MODEL  CHANGE      KEYS",
        "    b      new worker  port (also timeout)",
        "    a      apply live  rate_limit, timeout",
        "    unchanged: c",
        "    memory: ok",
    ]


def test_reload_of_a_file_needs_dry_run(daemon, target, capsys, tmp_path):
    code, _, err = ctl(daemon, capsys, "reload", str(tmp_path / "x.yaml"))
    assert code == exit_codes.USAGE and "FILE needs --dry-run" in err and target.calls == []


def test_install_service_writes_the_unit_and_says_how_to_enable_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    config = tmp_path / "c.yaml"
    config.write_text("models: {}\n")
    code = main(["install-service", "--systemd", "--user", "--config", str(config)])
    out = capsys.readouterr().out
    unit = tmp_path / ".config" / "systemd" / "user" / "vllmmlxd.service"
    assert code == exit_codes.OK
    assert unit.read_text().startswith("# vllmmlxd")
    assert out.splitlines() == [
        f"wrote {unit}",
        f"it runs the config {config} (given with --config)",
        "to start it now and at every boot, run:",
        "  systemctl --user daemon-reload",
        "  systemctl --user enable --now vllmmlxd",
    ]


def test_the_cli_imports_no_server_or_engine_modules():
    code = (
        "import sys, vllmmlxd.ctl.cli\n"
        "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'fastapi', 'uvicorn', 'starlette', 'mlx', 'mlx_lm'})\n"
        "print(','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert result.stdout.strip() == ""


def test_the_console_script_entry_point_runs(sock_dir):
    result = subprocess.run(
        [sys.executable, "-m", "vllmmlxd.ctl", "--socket", str(sock_dir / "x.sock"), "status"],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == exit_codes.UNREACHABLE
    assert "is vllmmlxd running?" in result.stderr


# -- the model store -----------------------------------------------------------------------------------


def test_pull_follows_the_pull_in_plain_lines_then_says_where_it_went(daemon, target, capsys):
    code, out, err = ctl(daemon, capsys, "pull", "org/m", "--revision", "v2")
    assert code == exit_codes.OK and err == ""
    assert target.calls == [("pull", "org/m", "v2")]
    lines = out.splitlines()
    assert lines[0] == "org/m: asking the hub for its files"
    assert lines[1] == "org/m: 25% of 4.00 GB, 50.0 MB/s, 1m00s left"  # the next one within 5 s is not repeated
    assert lines[2].startswith("pulled org/m @ cccccccccccc: 4.00 GB in ") and lines[2].endswith(
        "into /s/models/hub-org--m"
    )
    assert lines[3] == "serve it with `model: org/m` in an entry, then `vllmmlxctl reload`"


def test_pull_json_prints_each_status_and_a_failure_exits_1(daemon, target, capsys):
    code, out, _ = ctl(daemon, capsys, "pull", "org/m", "--json")
    assert code == exit_codes.OK
    assert [json.loads(line)["state"] for line in out.splitlines()] == [
        "resolving",
        "downloading",
        "downloading",
        "done",
    ]
    target.pull_script = [
        *target.pull_script[:1],
        target.pull_script[0].model_copy(update={"state": "failed", "error": "checksum mismatch in org/m: ..."}),
    ]
    code, out, err = ctl(daemon, capsys, "pull", "org/m")
    assert code == exit_codes.ERROR and err == "pull org/m failed: checksum mismatch in org/m: ...\n"


def test_a_bad_source_or_a_conflict_exits_1_with_the_daemons_words(daemon, target, capsys):
    code, _, err = ctl(daemon, capsys, "pull", "nope")
    assert code == exit_codes.ERROR and "is not a Hugging Face model repo id (org/name)" in err
    target.pull_conflict = "org/m@v1 is being pulled (p1): wait for it"
    code, _, err = ctl(daemon, capsys, "pull", "org/m")
    assert code == exit_codes.ERROR and err == "vllmmlxctl: org/m@v1 is being pulled (p1): wait for it\n"


def test_ctrl_c_stops_following_not_the_pull(daemon, capsys, monkeypatch):
    from vllmmlxd.ctl import cli

    def interrupted(self, pull_id):
        yield from ()
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.ControlClient, "follow_pull", interrupted)
    code, _, err = ctl(daemon, capsys, "pull", "org/m")
    assert code == 130 and "stopped following: the daemon goes on pulling org/m" in err
    assert "`vllmmlxctl pull --cancel org/m` stops it" in err


def test_pull_cancel_stops_the_pull_of_that_repo(daemon, target, capsys):
    target.pull_script[-1] = target.pull_script[1]  # still downloading
    code, out, _ = ctl(daemon, capsys, "pull", "--cancel", "org/m")
    assert code == exit_codes.OK and ("cancel_pull", "p1") in target.calls
    assert out == "the pull of org/m was cancelled; the files it finished stay: `vllmmlxctl pull org/m` resumes it\n"
    code, _, err = ctl(daemon, capsys, "pull", "--cancel", "org/other")
    assert code == exit_codes.ERROR and err == "vllmmlxctl: no pull of org/other is under way\n"


def test_models_lists_the_store_and_rm_deletes_one_unless_in_use(daemon, target, capsys):
    code, out, _ = ctl(daemon, capsys, "models")
    assert code == exit_codes.OK
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "SIZE", "USED", "BY", "SOURCE"]
    assert lines[1].split() == ["org/m", "pulled", "4.00", "GB", "-", "org/m", "@", "cccc"]
    assert lines[2].split() == ["builtin:tiny", "builtin", "12.9", "MB", "a", "built", "here"]
    assert lines[-1] == "store: /s/models (4.01 GB in 2, 50.0 GB free)"
    code, out, _ = ctl(daemon, capsys, "models", "--json")
    assert [m["used_by"] for m in json.loads(out)["models"]] == [[], ["a"]]

    code, _, err = ctl(daemon, capsys, "rm", "builtin:tiny")
    assert code == exit_codes.ERROR and err == "vllmmlxctl: builtin:tiny is in use by a\n"
    code, out, _ = ctl(daemon, capsys, "rm", "org/m")
    assert code == exit_codes.OK and out == "removed org/m (4.00 GB)\n"
    code, _, err = ctl(daemon, capsys, "rm", "org/m")
    assert code == exit_codes.ERROR and "no model 'org/m' in the store" in err


def test_status_shows_a_downloading_entry_and_the_pulls_under_way(daemon, target, capsys):
    downloading = target.pull_script[1]
    target.models = [model_status("q", "downloading", pid=None, download=downloading)]
    code, out, _ = ctl(daemon, capsys, "status")
    assert code == exit_codes.NOT_READY
    assert out.splitlines()[1].split()[:3] == ["q", "downloading", "25%"]


def test_usage_prints_each_key_s_use_and_budgets_over_the_asked_period(daemon, target, capsys):
    from vllmmlxd.control.protocol import BudgetStatus, UsageRow

    target.usage_rows = [
        UsageRow(
            key="alice", model="qwen", requests=3, errors=1, input_tokens=1200, cached_tokens=800, output_tokens=64
        ),
        UsageRow(key="", model="tiny", requests=1, errors=0, input_tokens=5, cached_tokens=0, output_tokens=2),
    ]
    target.budgets = [
        BudgetStatus(
            key="alice",
            tokens_per_day=10_000,
            tokens_per_month=0,
            requests_per_day=0,
            day_tokens=1264,
            month_tokens=1264,
            day_requests=3,
            left={"tokens_per_day": 8736, "tokens_per_month": None, "requests_per_day": None},
            day_resets="2026-12-05T00:00:00+00:00",
            month_resets="2027-01-01T00:00:00+00:00",
        )
    ]
    code, out, _ = ctl(daemon, capsys, "usage", "--since", "1h")
    assert code == 0 and target.calls[-1] == ("usage", 3600.0)
    assert "use over the last 1h00m" in out and "1,200 (800)" in out and "(no key)" in out
    assert "alice: 1,264 of 10,000 tokens today (8,736 left); the day resets 2026-12-05T00:00:00+00:00" in out
    code, out, _ = ctl(daemon, capsys, "usage", "--json")
    assert code == 0 and json.loads(out)["rows"][0]["cached_tokens"] == 800 and target.calls[-1] == ("usage", 86400.0)
    with pytest.raises(SystemExit):
        main(["--socket", str(daemon.path), "usage", "--since", "soon"])
