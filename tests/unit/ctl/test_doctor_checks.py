"""``vllmmlxctl doctor``'s decisions (vllmmlxd/ctl/doctor_checks.py), fed with each platform's values:
macOS's are shaped as mlx's ``device_info()``, ``sysctl`` and ``launchctl print`` give them."""

from __future__ import annotations

import socket
from pathlib import Path

from vllmmlxd.ctl import doctor_checks as dc
from vllmmlxd.ctl.doctor_probe import bind_error

GiB = 1024**3
# mx.device_info() on an M2 Max with 64 GB (its keys and the sizes Metal reports).
M2_MAX = {
    "default_device": "Device(gpu, 0)",
    "metal": True,
    "architecture": "applegpu_g14s",
    "device_name": "Apple M2 Max",
    "memory_size": 64 * GiB,
    "max_recommended_working_set_size": 51_539_607_552,  # 48 GiB
    "max_buffer_length": 36 * GiB,
}


def test_versions_need_mlx_and_mlx_lm_and_name_the_extra_for_mlx_vlm():
    found = {"mlx": "0.32.4", "mlx-cpu": "0.32.4", "mlx-lm": "0.32.2", "mlx-vlm": None, "mlx-audio": "0.6.2"}
    checks = {c.name: c for c in dc.version_checks(found, "0.1.0 (commit abc)", "3.11.7")}
    assert checks["vllmmlxd"].detail == "0.1.0 (commit abc)"
    assert checks["mlx"].level == "ok" and checks["mlx"].detail == "0.32.4 (mlx-cpu 0.32.4)"
    assert checks["mlx-vlm"].level == "ok" and "pip install 'vllmmlxd[vision]'" in checks["mlx-vlm"].detail
    assert checks["mlx-audio"].detail == "0.6.2"
    missing = {c.name: c for c in dc.version_checks({"mlx": "0.32.4"}, "0.1.0", "3.11.7")}
    assert missing["mlx-lm"].level == "fail" and "not installed" in missing["mlx-lm"].detail


def test_a_mac_reports_its_gpu_and_how_to_raise_the_wired_limit():
    gpu, wired = dc.macos_device_checks(M2_MAX, 0)
    assert gpu.level == "ok" and gpu.detail == "Apple M2 Max, 64.0 GiB memory, 48.0 GiB recommended working set"
    # All but 8 GiB (64 GB / 8): 56 GiB, more than the 48 GiB Metal recommends by default.
    assert wired.level == "ok" and "sudo sysctl iogpu.wired_limit_mb=57344" in wired.detail
    assert "macOS's default" in wired.detail and wired.data["suggested_mb"] == 57344


def test_a_wired_limit_set_by_hand_is_shown_and_only_raised_when_below_the_advice():
    (_, high) = dc.macos_device_checks(M2_MAX, 60_000)
    assert high.detail == "60000 MB (set by hand)"
    (_, low) = dc.macos_device_checks(M2_MAX, 40_000)
    assert "40000 MB (set by hand)" in low.detail and "iogpu.wired_limit_mb=57344" in low.detail
    (_, unknown) = dc.macos_device_checks(M2_MAX, None)
    assert unknown.level == "warn"


def test_the_wired_limit_advice_keeps_room_for_the_system():
    assert dc.wired_limit_advice(128 * GiB, 96 * GiB) == 112 * 1024  # an eighth kept back
    assert dc.wired_limit_advice(16 * GiB, 11 * GiB) == 11 * 1024  # 8 GiB kept back would go below Metal's own


def test_a_mac_without_metal_fails_and_an_unknown_device_warns():
    (cpu_only,) = dc.macos_device_checks({**M2_MAX, "metal": False}, 0)
    assert cpu_only.level == "fail" and "no Metal GPU" in cpu_only.detail
    assert dc.macos_device_checks(None, 0)[0].level == "warn"


def test_linux_reports_cores_and_the_blas_the_self_test_ran_with():
    mkl = {"name": "mkl", "path": "/v/lib/libmkl_rt.so.3", "threads": 1, "warning": None}
    cpu, blas = dc.linux_device_checks(2, 16, "x86_64", mkl, [])
    assert cpu.detail == "x86_64, 2 of 16 cores usable" and cpu.data == {"cores": 2}
    assert blas.level == "ok" and blas.detail == "mkl (/v/lib/libmkl_rt.so.3), 1 thread(s)"
    bundled = {"name": "bundled", "path": "/v/libblas.so", "threads": 1, "warning": None}
    assert "vllmmlxd[linux-fast]" in dc.linux_device_checks(2, 2, "x86_64", bundled, [])[1].detail
    fell_back = {**mkl, "warning": "mkl: failed its self-check"}
    assert dc.linux_device_checks(2, 2, "x86_64", fell_back, [])[1].level == "warn"
    # No self-test report: the libraries a worker would try.
    assert dc.linux_device_checks(2, 2, "aarch64", None, ["openblas (/usr/lib/libopenblas.so.0)"])[1].level == "ok"
    assert dc.linux_device_checks(2, 2, "aarch64", None, [])[1].level == "warn"


def test_the_state_dir_needs_room_and_write_access(tmp_path):
    assert dc.state_check(tmp_path, True, True, 50 * GiB).level == "ok"
    assert dc.state_check(tmp_path, True, True, 5 * GiB).level == "warn"
    assert dc.state_check(tmp_path, True, True, GiB // 2).level == "fail"
    assert dc.state_check(tmp_path, True, False, 50 * GiB).level == "fail"
    later = dc.state_check(tmp_path / "new", False, True, 50 * GiB)
    assert later.level == "ok" and "created at the first start" in later.detail


def test_configs_are_looked_for_where_install_service_and_homebrew_put_them():
    home = Path("/Users/ann")
    mac = dc.config_candidates({"HOMEBREW_PREFIX": "/opt/homebrew"}, home, "darwin")
    assert mac == [
        home / ".config/vllmmlxd/config.yaml",
        Path("/opt/homebrew/etc/vllmmlxd/config.yaml"),
        Path("/usr/local/etc/vllmmlxd/config.yaml"),
        Path("/etc/vllmmlxd/config.yaml"),
    ]
    linux = dc.config_candidates({"XDG_CONFIG_HOME": "/x"}, Path("/home/ann"), "linux")
    assert linux == [Path("/x/vllmmlxd/config.yaml"), Path("/etc/vllmmlxd/config.yaml")]


def test_a_daemon_that_does_not_answer_is_a_warning():
    sock = Path("/run/vllmmlxd/control.sock")
    assert dc.daemon_check(sock, None, "connection refused", "0.1.0").level == "warn"
    status = {
        "daemon": {"pid": 7, "config_path": "/etc/c.yaml", "version": "0.1.0"},
        "models": [{"state": "ready"}, {"state": "starting"}],
    }
    up = dc.daemon_check(sock, status, "", "0.1.0")
    assert up.level == "ok" and "1 of 2 model(s) ready" in up.detail
    older = dc.daemon_check(sock, {**status, "daemon": {**status["daemon"], "version": "0.0.9"}}, "", "0.1.0")
    assert older.level == "warn" and "it runs 0.0.9" in older.detail


def test_service_managers_answers_read_in_one_word():
    assert dc.service_state("systemd", "user", 0, "LoadState=loaded\nActiveState=active\n") == "active"
    assert dc.service_state("systemd", "user", 0, "LoadState=not-found\nActiveState=inactive\n") is None
    assert dc.service_state("systemd", "user", 1, "") == "unknown"  # no session bus
    assert dc.service_state("systemd", "user", None, "") is None  # no systemctl
    printed = "gui/501/homebrew.mxcl.vllmmlxd = {\n\tactive count = 1\n\tstate = running\n\tprogram = /opt/x\n}"
    assert dc.service_state("launchd", "homebrew", 0, printed) == "running"
    assert dc.service_state("launchd", "user", 113, "Could not find service") is None


def test_the_manager_check_never_fails():
    assert dc.manager_check({}, None).level == "skip"
    assert dc.manager_check({"user": "unknown", "system": "unknown"}, "systemctl").level == "skip"
    assert "not installed as a service" in dc.manager_check({"user": None, "system": None}, "systemctl").detail
    running = dc.manager_check({"homebrew": "running", "user": None}, "launchctl")
    assert running.level == "ok" and running.detail == "launchctl: homebrew running"
    assert dc.manager_check({"user": "failed"}, "systemctl").level == "warn"


def test_ports_are_free_held_by_this_daemon_or_held_by_something_else():
    assert dc.port_check("model tiny", "127.0.0.1", 8001, None, None).data["state"] == "free"
    mine = dc.port_check("model tiny", "127.0.0.1", 8001, "in use", {("127.0.0.1", 8001): "model tiny"})
    assert mine.level == "ok" and mine.data["state"] == "daemon"
    other = dc.port_check("gateway", "127.0.0.1", 8080, "in use", {})
    assert other.level == "fail" and other.data["state"] == "other" and "lsof" in other.detail
    assert dc.port_check("gateway", "10.9.9.9", 80, "Cannot assign requested address", None).level == "warn"


def test_a_held_port_is_seen_as_held():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        assert bind_error("127.0.0.1", port) == "in use"
    assert bind_error("127.0.0.1", port) is None


def test_the_self_test_makes_one_check_per_path_and_names_a_broken_one():
    result = {
        "model": "builtin:tiny",
        "precision": "float32",
        "prefix_cache": "blocks",
        "load_s": 0.3,
        "reference_s": 0.2,
        "paths": [
            {"name": "batch", "level": "ok", "detail": "24 tokens as mlx-lm's", "seconds": 0.1},
            {"name": "prefix_cache", "level": "fail", "detail": "differs from mlx-lm: ...", "seconds": 0.2},
            {"name": "speculation", "level": "warn", "detail": "not run: ...", "seconds": 0.0},
        ],
    }
    checks = dc.selftest_checks(result, None, 2.0)
    assert [c.key for c in checks] == ["engine.load", "engine.batch", "engine.prefix_cache", "engine.speculation"]
    assert dc.failed(checks) == ["engine.prefix_cache"]
    (crashed,) = dc.selftest_checks(None, "the self-test's process exited 1 without a report: Segfault", 1.0)
    assert crashed.key == "engine.selftest" and crashed.level == "fail" and "Segfault" in crashed.detail
    (unloadable,) = dc.selftest_checks({"model": "x", "error": "cannot load x: ..."}, None, 1.0)
    assert unloadable.detail == "cannot load x: ..."
