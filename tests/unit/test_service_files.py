"""The systemd unit and launchd plist: rendered, checked by systemd-analyze, parsed by plistlib."""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from vllmmlxd import service_files as sf

REPO = Path(__file__).resolve().parents[2]
SERVICE = REPO / "service"
UNIT = "vllmmlxd.service"
SANDBOX = (
    "StateDirectory",
    "ProtectSystem",
    "PrivateTmp",
    "ProtectHome",
    "ProtectKernelTunables",
    "ProtectControlGroups",
)

needs_analyze = pytest.mark.skipif(
    shutil.which("systemd-analyze") is None,
    reason="systemd-analyze not installed (Debian: apt-get install systemd; `make test` does it)",
)


def settings(text: str) -> dict[str, list[str]]:
    """Key -> values of a unit file, comments and section headers left out."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            found.setdefault(key, []).append(value)
    return found


def verify(unit_text: str, tmp_path: Path, *, user: bool) -> str:
    """Run systemd-analyze verify on the text; assert it found nothing wrong with our unit."""
    unit_dir = tmp_path / "units"
    unit_dir.mkdir()
    (unit_dir / UNIT).write_text(unit_text)
    env = dict(os.environ)
    args = ["systemd-analyze"]
    if user:
        # A user manager wants a runtime dir even to verify; a private one keeps the host's out of it.
        runtime = tmp_path / "runtime"
        runtime.mkdir(mode=0o700)
        env["XDG_RUNTIME_DIR"] = str(runtime)
        args.append("--user")
    done = subprocess.run([*args, "verify", str(unit_dir / UNIT)], capture_output=True, text=True, env=env, timeout=60)
    output = done.stdout + done.stderr
    problems = [line for line in output.splitlines() if UNIT in line]
    assert not problems, output
    assert done.returncode == 0, output
    return output


def real_exe() -> str:
    # systemd-analyze verify checks that ExecStart's binary exists and is executable.
    return sys.executable


# --- service/ is the rendered template, nothing more ---------------------------------------


def test_service_dir_holds_the_rendered_templates():
    for name, data in sf.render_templates().items():
        assert (SERVICE / name).read_bytes() == data, (
            f"regenerate with: python -m vllmmlxd.service_files service/ ({name})"
        )


# --- systemd ------------------------------------------------------------------------------


def test_system_unit_settings():
    text = (SERVICE / UNIT).read_text()
    s = settings(text)
    expected = {
        "Type": "notify",
        "ExecStart": "/usr/local/bin/vllmmlxd run --config /etc/vllmmlxd/config.yaml",
        "ExecReload": "/bin/kill -HUP $MAINPID",
        "Restart": "on-failure",
        "RestartSec": "2",
        "RestartPreventExitStatus": "78",
        "WatchdogSec": "30",
        "TimeoutStopSec": "60",
        "KillMode": "mixed",
        "NotifyAccess": "main",
        "StateDirectory": "vllmmlxd",
        "DynamicUser": "yes",
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "PrivateTmp": "yes",
        "ProtectHome": "read-only",
        "ProtectKernelTunables": "yes",
        "ProtectControlGroups": "yes",
        "RestrictSUIDSGID": "yes",
        "LockPersonality": "yes",
        "WantedBy": "multi-user.target",
        "After": "network-online.target",
        "Wants": "network-online.target",
    }
    for key, value in expected.items():
        assert s.get(key) == [value], key
    assert "VLLMMLXD_STATE_DIR=/var/lib/vllmmlxd" in s["Environment"]
    for absent in ("User", "Group", "MemoryDenyWriteExecute", "ReadWritePaths", "LoadCredential"):
        assert absent not in s
    assert "MemoryDenyWriteExecute" in text  # explained in a comment
    # Secrets: how to hand a root-only file to the service, and the path the config names it by.
    assert "\n#LoadCredential=api_key:/etc/vllmmlxd/api_key\n" in text
    assert "${file:/run/credentials/vllmmlxd.service/api_key}" in text


def system_account(s: dict[str, list[str]]) -> str:
    """Who a system unit runs as: 'dynamic', an account name, or 'root' when nothing says otherwise."""
    if s.get("DynamicUser") == ["yes"]:
        assert "User" not in s
        return "dynamic"
    return s.get("User", ["root"])[-1]


@pytest.mark.parametrize("state", ["/var/lib/vllmmlxd", "/var/lib/ai/vllmmlxd", "/srv/vllmmlxd", "/var/lib/../srv/x"])
def test_a_system_unit_never_runs_as_root(state):
    s = settings(sf.render_systemd_unit("/usr/bin/vllmmlxd", Path("/etc/c.yaml"), Path(state), user=False))
    account = system_account(s)
    assert account not in ("root", "0")
    if os.path.normpath(state).startswith("/var/lib/"):
        # systemd owns the state dir for the allocated uid: nothing to create by hand.
        assert account == "dynamic"
        assert s["StateDirectory"] == [os.path.relpath(os.path.normpath(state), "/var/lib")]
    else:
        # DynamicUser= cannot own a folder outside /var/lib: a fixed account that must own it.
        assert account == sf.SERVICE_ACCOUNT and s["Group"] == [sf.SERVICE_ACCOUNT] and "DynamicUser" not in s
        assert s["ReadWritePaths"] == [os.path.normpath(state)] and "StateDirectory" not in s
    for key in ("NoNewPrivileges", "ProtectSystem", "PrivateTmp", "ProtectHome", "RestrictSUIDSGID"):
        assert key in s, key


def test_the_template_unit_runs_unprivileged():
    assert system_account(settings((SERVICE / UNIT).read_text())) == "dynamic"


def test_line_breaks_in_paths_are_refused():
    with pytest.raises(ValueError, match="line break"):
        sf.render_systemd_unit("/usr/bin/vllmmlxd", Path("/etc/c.yaml"), Path("/srv/x\nUser=root"), user=False)


@needs_analyze
def test_template_unit_passes_systemd_analyze(tmp_path):
    text = (SERVICE / UNIT).read_text().replace("ExecStart=/usr/local/bin/vllmmlxd", f"ExecStart={real_exe()}")
    assert real_exe() in text
    verify(text, tmp_path, user=False)


@needs_analyze
def test_rendered_system_unit_passes_systemd_analyze(tmp_path):
    text = sf.render_systemd_unit(real_exe(), tmp_path / "my config%1.yaml", Path("/srv/vllmmlxd state"), user=False)
    s = settings(text)
    # Outside /var/lib, StateDirectory= cannot name it: it is made writable instead.
    assert s["ReadWritePaths"] == ['"/srv/vllmmlxd state"'] and "StateDirectory" not in s
    verify(text, tmp_path, user=False)


@needs_analyze
def test_unit_with_a_credential_passes_systemd_analyze(tmp_path):
    text = sf.render_systemd_unit(real_exe(), Path("/etc/vllmmlxd/config.yaml"), Path("/var/lib/vllmmlxd"), user=False)
    text = text.replace("\n#LoadCredential=", "\nLoadCredential=")
    assert settings(text)["LoadCredential"] == ["api_key:/etc/vllmmlxd/api_key"]
    verify(text, tmp_path, user=False)


@needs_analyze
def test_rendered_user_unit_passes_systemd_analyze(tmp_path):
    text = sf.render_systemd_unit(real_exe(), tmp_path / "config.yaml", tmp_path / ".local/state/vllmmlxd", user=True)
    verify(text, tmp_path, user=True)


@needs_analyze
def test_quoting_reaches_systemd_intact(tmp_path):
    # A missing binary is the one error verify reports with the path as systemd parsed it.
    missing = "/nonexistent dir/vll%m$x"
    text = sf.render_systemd_unit(missing, Path("/etc/c.yaml"), Path("/var/lib/vllmmlxd"), user=False)
    (tmp_path / UNIT).write_text(text)
    done = subprocess.run(
        ["systemd-analyze", "verify", str(tmp_path / UNIT)], capture_output=True, text=True, timeout=60
    )
    assert missing in done.stderr, done.stderr


def test_user_unit_drops_privileged_sandboxing(tmp_path):
    state = tmp_path / "state dir"
    s = settings(sf.render_systemd_unit("/usr/bin/vllmmlxd", Path("/c.yaml"), state, user=True))
    assert s["WantedBy"] == ["default.target"]
    assert s["Environment"] == [f'"VLLMMLXD_STATE_DIR={state}"']
    for key in (*SANDBOX, "DynamicUser", "User", "LoadCredential"):
        assert key not in s, key
    assert s["NoNewPrivileges"] == ["yes"] and s["Type"] == ["notify"]


def test_relative_paths_are_refused():
    with pytest.raises(ValueError, match="exe"):
        sf.render_systemd_unit("vllmmlxd", Path("/c.yaml"), Path("/var/lib/vllmmlxd"), user=False)
    with pytest.raises(ValueError, match="config"):
        sf.render_systemd_unit("/bin/vllmmlxd", Path("c.yaml"), Path("/var/lib/vllmmlxd"), user=False)
    with pytest.raises(ValueError, match="log_dir"):
        sf.render_launchd_plist("/bin/vllmmlxd", Path("/c.yaml"), Path("/s"), Path("logs"))


# --- launchd ------------------------------------------------------------------------------


def test_template_plist_keys_and_types():
    plist = plistlib.loads((SERVICE / "io.vllmmlxd.daemon.plist").read_bytes())
    assert plist["Label"] == "io.vllmmlxd.daemon"
    assert plist["ProgramArguments"] == [
        "/opt/homebrew/bin/vllmmlxd",
        "run",
        "--config",
        "/opt/homebrew/etc/vllmmlxd/config.yaml",
    ]
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ThrottleInterval"] == 10 and type(plist["ThrottleInterval"]) is int
    assert plist["ExitTimeOut"] == 60 and type(plist["ExitTimeOut"]) is int
    assert plist["ProcessType"] == "Interactive"
    assert plist["StandardOutPath"] == plist["StandardErrorPath"] == "/opt/homebrew/var/log/vllmmlxd/vllmmlxd.log"
    env = plist["EnvironmentVariables"]
    assert set(env) == {"PATH", "VLLMMLXD_STATE_DIR"}
    assert all(isinstance(v, str) and v.startswith("/") for v in env.values())
    assert "~" not in (SERVICE / "io.vllmmlxd.daemon.plist").read_text()
    # The template is a LaunchAgent's shape (the Homebrew prefix belongs to its user): no UserName.
    assert "UserName" not in plist


def test_a_launch_daemon_runs_as_the_given_account(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    daemon = sf.make_service_file(
        "launchd",
        False,
        tmp_path / "c.yaml",
        exe="/opt/v/bin/vllmmlxd",
        path=tmp_path / "d.plist",
        state_dir=tmp_path / "state",
        log_dir=tmp_path / "logs",
        account="alice",
    )
    assert plistlib.loads(daemon.content)["UserName"] == "alice"
    assert daemon.owner == "alice" and daemon.dirs == (tmp_path / "state", tmp_path / "logs")
    agent = sf.make_service_file(
        "launchd", True, tmp_path / "c.yaml", exe="/opt/v/bin/vllmmlxd", path=tmp_path / "a.plist"
    )
    assert "UserName" not in plistlib.loads(agent.content) and agent.owner is None
    for bad in ("root", ""):
        with pytest.raises(ValueError, match="unprivileged"):
            sf.render_launchd_plist("/bin/vllmmlxd", Path("/c.yaml"), Path("/s"), Path("/l"), user_name=bad)


def test_a_launch_daemon_defaults_to_the_admin_who_ran_sudo(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(sf.os, "geteuid", lambda: 0)
    assert sf.default_daemon_account({"SUDO_USER": "alice"}) == "alice"
    for environ in ({}, {"SUDO_USER": "root"}):
        with pytest.raises(ValueError, match="must not run as root"):
            sf.default_daemon_account(environ)
    monkeypatch.setenv("SUDO_USER", "bob")
    service = sf.make_service_file(
        "launchd",
        False,
        tmp_path / "c.yaml",
        exe="/opt/v/bin/vllmmlxd",
        path=tmp_path / "d.plist",
        state_dir=tmp_path / "s",
        log_dir=tmp_path / "l",
    )
    assert plistlib.loads(service.content)["UserName"] == "bob"


def test_a_launch_daemon_run_by_a_plain_user_runs_as_that_user(monkeypatch):
    import pwd

    monkeypatch.setattr(sf.os, "geteuid", lambda: 4242)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: pwd.struct_passwd(("carol", "x", uid, uid, "", "/", "/bin/sh")))
    assert sf.default_daemon_account({"SUDO_USER": "mallory"}) == "carol"


@pytest.mark.skipif(os.geteuid() != 0, reason="handing a folder to another account needs root")
def test_writing_a_launch_daemon_hands_its_dirs_to_the_account(tmp_path):
    import pwd

    nobody = pwd.getpwnam("nobody")
    service = sf.make_service_file(
        "launchd",
        False,
        tmp_path / "c.yaml",
        exe="/opt/v/bin/vllmmlxd",
        path=tmp_path / "d.plist",
        state_dir=tmp_path / "s",
        log_dir=tmp_path / "l",
        account="nobody",
    )
    sf.write_service_file(service)
    assert [(tmp_path / d).stat().st_uid for d in ("s", "l")] == [nobody.pw_uid] * 2
    assert (tmp_path / "d.plist").stat().st_uid == 0  # the plist itself stays root's


def test_rendered_plist_puts_the_install_bin_first(tmp_path):
    exe = str(tmp_path / "venv/bin/vllmmlxd")
    data = sf.render_launchd_plist(
        exe, tmp_path / "c.yaml", tmp_path / "App Support", tmp_path / "logs", label="io.example.x"
    )
    plist = plistlib.loads(data)
    assert plist["Label"] == "io.example.x"
    assert plist["ProgramArguments"][0] == exe
    assert plist["EnvironmentVariables"]["PATH"].startswith(str(tmp_path / "venv/bin") + ":")
    assert plist["EnvironmentVariables"]["VLLMMLXD_STATE_DIR"] == str(tmp_path / "App Support")
    assert plist["StandardErrorPath"] == str(tmp_path / "logs/vllmmlxd.log")


# --- where files go, how they are enabled, defaults, the writer ----------------------------


def test_install_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert sf.install_paths("systemd", user=False) == Path("/etc/systemd/system/vllmmlxd.service")
    assert sf.install_paths("systemd", user=True) == tmp_path / ".config/systemd/user/vllmmlxd.service"
    assert sf.install_paths("launchd", user=False) == Path("/Library/LaunchDaemons/io.vllmmlxd.daemon.plist")
    assert sf.install_paths("launchd", user=True) == tmp_path / "Library/LaunchAgents/io.vllmmlxd.daemon.plist"
    with pytest.raises(ValueError):
        sf.install_paths("upstart", user=False)  # type: ignore[arg-type]


def test_enable_commands(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "with space"))
    assert sf.enable_commands("systemd", user=False) == ["systemctl daemon-reload", "systemctl enable --now vllmmlxd"]
    assert sf.enable_commands("systemd", user=True) == [
        "systemctl --user daemon-reload",
        "systemctl --user enable --now vllmmlxd",
    ]
    assert sf.enable_commands("launchd", user=False)[-1] == (
        "launchctl bootstrap system /Library/LaunchDaemons/io.vllmmlxd.daemon.plist"
    )
    user_cmds = sf.enable_commands("launchd", user=True)
    assert shlex.split(user_cmds[-1]) == [
        "launchctl",
        "bootstrap",
        f"gui/{os.getuid()}",
        str(sf.install_paths("launchd", user=True)),
    ]
    assert sf.disable_commands("launchd", user=True) == [f"launchctl bootout gui/{os.getuid()}/io.vllmmlxd.daemon"]


def test_default_exe_is_next_to_the_interpreter(monkeypatch, tmp_path):
    bin_dir = tmp_path / "venv/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "vllmmlxd").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    assert sf.default_exe() == str(bin_dir / "vllmmlxd")


def test_default_state_dirs(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    assert sf.default_state_dir("systemd", user=True) == tmp_path / ".local/state/vllmmlxd"
    assert sf.default_state_dir("systemd", user=False) == Path("/var/lib/vllmmlxd")
    assert sf.default_state_dir("launchd", user=True) == tmp_path / "Library/Application Support/vllmmlxd"


def test_make_and_write_a_user_unit(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.chdir(tmp_path)
    service = sf.make_service_file("systemd", True, Path("config.yaml"), exe="/opt/v/bin/vllmmlxd")
    assert service.path == tmp_path / ".config/systemd/user/vllmmlxd.service"
    assert service.dirs == (tmp_path / ".local/state/vllmmlxd",)
    assert service.commands[0] == "systemctl --user daemon-reload"
    assert f"--config {tmp_path / 'config.yaml'}" in service.content.decode()  # made absolute
    written = sf.write_service_file(service)
    assert written.read_bytes() == service.content
    assert stat.S_IMODE(written.stat().st_mode) == 0o644
    assert (tmp_path / ".local/state/vllmmlxd").is_dir()
    assert [p.name for p in written.parent.iterdir()] == ["vllmmlxd.service"]  # no temp file left


def test_make_a_launchd_plist(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    service = sf.make_service_file(
        "launchd", True, tmp_path / "c.yaml", exe="/opt/v/bin/vllmmlxd", path=tmp_path / "x.plist"
    )
    plist = plistlib.loads(service.content)
    assert plist["StandardOutPath"] == str(tmp_path / "Library/Logs/vllmmlxd/vllmmlxd.log")
    assert tmp_path / "Library/Logs/vllmmlxd" in service.dirs
    assert service.commands[-1].endswith(str(tmp_path / "x.plist"))


def test_imports_no_mlx_or_fastapi():
    code = (
        "import sys, vllmmlxd.service_files, vllmmlxd.supervisor.notify\n"
        "heavy = {m.split('.')[0] for m in sys.modules} & {'mlx', 'mlx_lm', 'fastapi', 'pydantic', 'httpx'}\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_system_unit_warns_of_paths_under_tmp():
    paths = {"the executable": Path("/tmp/clone/.venv/bin/vllmmlxd"), "the config": Path("/etc/vllmmlxd/config.yaml")}
    [warning] = sf.reach_warnings("systemd", False, paths, mode_of=lambda p: 0o40755)
    assert warning.startswith(
        "the executable /tmp/clone/.venv/bin/vllmmlxd is under /tmp, which the unit's "
        "PrivateTmp=yes hides from the service"
    )
    assert "Where to install for a service" in warning
    # A user unit runs as you, with your /tmp; launchd has no private /tmp.
    assert sf.reach_warnings("systemd", True, paths) == [] and sf.reach_warnings("launchd", False, paths) == []


def test_a_system_unit_warns_of_paths_in_a_private_home():
    modes = {Path("/home"): 0o40755, Path("/home/ann"): 0o40700}
    paths = {"its Python": Path("/home/ann/.pyenv/versions/3.11.7/bin/python3.11")}
    [warning] = sf.reach_warnings("systemd", False, paths, mode_of=lambda p: modes.get(p, 0o40755))
    assert warning.startswith(
        "its Python /home/ann/.pyenv/versions/3.11.7/bin/python3.11 is inside /home/ann "
        "(mode 700), which other accounts cannot enter"
    )
    assert (
        sf.reach_warnings("systemd", False, {"x": Path("/opt/vllmmlxd/bin/vllmmlxd")}, mode_of=lambda p: 0o40755) == []
    )
    assert sf.reach_warnings("systemd", False, {"x": Path("/nowhere/bin/x")}, mode_of=lambda p: None) == []


def test_service_paths_follow_a_venv_script_to_its_base_python(tmp_path):
    base = tmp_path / "base" / "python3"
    base.parent.mkdir()
    base.write_text("")
    venv_python = tmp_path / "venv" / "bin" / "python"
    venv_python.parent.mkdir(parents=True)
    venv_python.symlink_to(base)
    exe = venv_python.parent / "vllmmlxd"
    exe.write_text(f"#!{venv_python}\nimport sys\n")
    paths = sf.service_paths(str(exe), Path("/etc/c.yaml"))
    assert paths == {"the executable": exe, "its Python": base, "the config": Path("/etc/c.yaml")}


def test_install_service_prints_the_warning(monkeypatch, capsys):
    from vllmmlxd.ctl.cli import main

    exe = "/tmp/clone/.venv/bin/vllmmlxd"  # a clone in /tmp, as a first try often is
    monkeypatch.setattr(sf, "default_exe", lambda: str(exe))
    assert main(["install-service", "--systemd", "--print", "--config", "/etc/vllmmlxd/config.yaml"]) == 0
    out, err = capsys.readouterr()
    assert f"ExecStart={exe} run" in out
    assert f"warning: the executable {exe} is under /tmp, which the unit's PrivateTmp=yes hides" in err
