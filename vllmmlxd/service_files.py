"""The systemd unit and launchd plist for this installation, for ``vllmmlxctl install-service``.

This module is the single source of truth: ``service/vllmmlxd.service`` and
``service/io.vllmmlxd.daemon.plist`` are its output for the template installs
(``TEMPLATE_SYSTEMD``, ``TEMPLATE_LAUNCHD``), regenerated with
``python -m vllmmlxd.service_files service/`` and held equal by a test. Rendering is
pure; ``make_service_file`` picks the defaults and ``write_service_file`` writes. Stdlib only.
A system service never runs as root: systemd's gets ``DynamicUser=`` (or a ``User=``), a
LaunchDaemon a ``UserName``.
"""

from __future__ import annotations

import os
import plistlib
import pwd
import re
import shlex
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypedDict

from .paths import ENV_STATE_DIR

Kind = Literal["systemd", "launchd"]
UNIT_NAME = "vllmmlxd.service"
LABEL = "io.vllmmlxd.daemon"
LOG_NAME = "vllmmlxd.log"
BASE_PATH = "/opt/homebrew/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"


class SystemdInstall(TypedDict):
    """What a systemd unit is rendered from (``render_systemd_unit``'s arguments)."""

    exe: str
    config: Path
    state_dir: Path
    user: bool


class LaunchdInstall(TypedDict):
    """What a launchd plist is rendered from (``render_launchd_plist``'s required arguments)."""

    exe: str
    config: Path
    state_dir: Path
    log_dir: Path


TEMPLATE_SYSTEMD = SystemdInstall(
    exe="/usr/local/bin/vllmmlxd",
    config=Path("/etc/vllmmlxd/config.yaml"),
    state_dir=Path("/var/lib/vllmmlxd"),
    user=False,
)
TEMPLATE_LAUNCHD = LaunchdInstall(
    exe="/opt/homebrew/bin/vllmmlxd",
    config=Path("/opt/homebrew/etc/vllmmlxd/config.yaml"),
    state_dir=Path("/opt/homebrew/var/vllmmlxd"),
    log_dir=Path("/opt/homebrew/var/log/vllmmlxd"),  # where the Homebrew formula logs too
)

SERVICE_ACCOUNT = "vllmmlxd"  # the system unit's User= when DynamicUser= cannot be used
# Where systemd puts a system unit's LoadCredential= files: its $CREDENTIALS_DIRECTORY.
CREDENTIALS_DIR = f"/run/credentials/{UNIT_NAME}"

_SAFE = re.compile(r"[A-Za-z0-9_@%+=:,./-]+")
_VAR_LIB = Path("/var/lib")


def _absolute(value: str | Path, what: str) -> str:
    if not os.path.isabs(value):
        raise ValueError(f"{what} must be an absolute path, got {str(value)!r}")
    if any(c in str(value) for c in "\n\r\0"):
        # A line break would end the unit line and start a directive of the path's choosing.
        raise ValueError(f"{what} must not contain a line break or NUL, got {str(value)!r}")
    return str(value)


def _quote(word: str, *, exec_line: bool = True) -> str:
    """One word for a unit file: % doubled (specifiers), $ doubled in Exec arguments, quoted if needed."""
    text = word.replace("%", "%%")
    if exec_line:
        text = text.replace("$", "$$")
    if _SAFE.fullmatch(word):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_systemd_unit(exe: str, config: Path, state_dir: Path, user: bool) -> str:
    """The vllmmlxd.service text: a system unit, or a ``--user`` unit without privileged sandboxing."""
    # systemd expands $VARS in the arguments but not in the executable's path.
    exec_start = " ".join(
        [_quote(_absolute(exe, "exe"), exec_line=False)]
        + [_quote(w) for w in ("run", "--config", _absolute(config, "config"))]
    )
    state = os.path.normpath(_absolute(state_dir, "state_dir"))
    lines = [
        "# vllmmlxd: serves local LLMs with MLX, one supervised worker process per model.",
        "# Rendered by vllmmlxd/service_files.py; `vllmmlxctl install-service` writes one for your",
        f"# install. Override settings with `systemctl{' --user' if user else ''} edit vllmmlxd`.",
        "[Unit]",
        "Description=vllmmlxd local LLM server (MLX)",
        "After=network-online.target",
        "Wants=network-online.target",
        "",
        "[Service]",
        "Type=notify",
        "# Only the daemon talks to systemd; its workers start without NOTIFY_SOCKET.",
        "NotifyAccess=main",
        f"ExecStart={exec_start}",
        "# SIGHUP re-reads the config; only the models that changed restart.",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "Restart=on-failure",
        "RestartSec=2",
        "# 78 (EX_CONFIG) is a bad config file: restarting would only fail the same way.",
        "RestartPreventExitStatus=78",
        "# The daemon pings every WatchdogSec/2; a hung event loop is killed and restarted.",
        "WatchdogSec=30",
        "# SIGTERM reaches the daemon only: it drains requests (drain_timeout, 30 s by default)",
        "# and stops its workers itself. Whatever is left after TimeoutStopSec gets SIGKILL.",
        "KillMode=mixed",
        "TimeoutStopSec=60",
        "# Models, downloads and the control socket (<state dir>/control.sock) live here.",
        f"Environment={_quote(f'{ENV_STATE_DIR}={state}', exec_line=False)}",
    ]
    if user:
        lines += [
            "# A user manager cannot build mount namespaces: only the hardening that needs no privileges.",
            "NoNewPrivileges=yes",
            "RestrictSUIDSGID=yes",
            "LockPersonality=yes",
        ]
    else:
        lines += _system_sandbox(Path(state))
    lines += [
        "# No MemoryDenyWriteExecute=: MLX compiles its kernels at run time into executable memory.",
        "",
        "[Install]",
        f"WantedBy={'default.target' if user else 'multi-user.target'}",
    ]
    return "\n".join(lines) + "\n"


def _under_var_lib(state: Path) -> bool:
    # StateDirectory= names a folder below /var/lib, and only there can systemd own it for us.
    state = Path(os.path.normpath(state))  # /var/lib/../etc is not below /var/lib
    return state != _VAR_LIB and state.is_relative_to(_VAR_LIB)


def _system_sandbox(state: Path) -> list[str]:
    if _under_var_lib(state):
        account = [
            "# Never root: a uid allocated at each start, which owns the state dir and nothing else.",
            "# systemd creates the state dir (really /var/lib/private/...) and re-owns it when the uid",
            "# changes, so the model cache survives. The control socket in it is reachable by root",
            f"# only: sudo vllmmlxctl --socket {shlex.quote(str(state / 'control.sock'))} status",
            "DynamicUser=yes",
            f"StateDirectory={_quote(os.path.relpath(state, _VAR_LIB), exec_line=False)}",
        ]
    else:
        account = [
            "# The state dir is outside /var/lib, where DynamicUser= cannot own it: run as an account",
            f"# made for it first: useradd --system --home-dir {state} vllmmlxd; chown vllmmlxd: {state}",
            f"User={SERVICE_ACCOUNT}",
            f"Group={SERVICE_ACCOUNT}",
            "# It must exist, and stays writable under ProtectSystem=strict.",
            f"ReadWritePaths={_quote(str(state), exec_line=False)}",
        ]
    hf_home = f"HF_HOME={state / 'huggingface'}"
    return [
        *account,
        "# The config must be readable by this account (mode 0644); secrets stay root-only and come",
        "# in as credentials: uncomment, and write in the config",
        f"#   api_key: ${{file:{CREDENTIALS_DIR}/api_key}}",
        "# (this unit's $CREDENTIALS_DIRECTORY). Re-read at restart, not at reload.",
        "#LoadCredential=api_key:/etc/vllmmlxd/api_key",
        "# ProtectHome= leaves ~ read-only: the Hugging Face download cache lives in the state dir.",
        f"Environment={_quote(hf_home, exec_line=False)}",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "PrivateTmp=yes",
        "ProtectHome=read-only",
        "ProtectKernelTunables=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
    ]


def render_launchd_plist(
    exe: str,
    config: Path,
    state_dir: Path,
    log_dir: Path,
    label: str = LABEL,
    user_name: str | None = None,
) -> bytes:
    """The launchd property list: restart on crash only, logs to ``log_dir``/vllmmlxd.log.

    ``user_name`` is the account a LaunchDaemon runs as (launchd starts one as root without it);
    a per-user LaunchAgent runs as its user and needs none.
    """
    exe = _absolute(exe, "exe")
    log = str(Path(_absolute(log_dir, "log_dir")) / LOG_NAME)
    # launchd starts with a bare PATH; put the install's own bin dir first so a venv works.
    bin_dir = os.path.dirname(exe)
    path = BASE_PATH if bin_dir in BASE_PATH.split(":") else f"{bin_dir}:{BASE_PATH}"
    plist = {
        "Label": label,
        "ProgramArguments": [exe, "run", "--config", _absolute(config, "config")],
        "RunAtLoad": True,
        "KeepAlive": {"SuccessfulExit": False},
        "ThrottleInterval": 10,
        # The daemon drains requests for up to drain_timeout (30 s) before it exits.
        "ExitTimeOut": 60,
        # Interactive: macOS must not throttle the GPU work as it would a background job.
        "ProcessType": "Interactive",
        "StandardOutPath": log,
        "StandardErrorPath": log,
        "EnvironmentVariables": {"PATH": path, ENV_STATE_DIR: _absolute(state_dir, "state_dir")},
    }
    if user_name is not None:
        if not user_name or user_name == "root":
            raise ValueError(f"a LaunchDaemon must run as an unprivileged account, got {user_name!r}")
        plist["UserName"] = user_name
    return plistlib.dumps(plist)


def default_kind() -> Kind:
    """launchd on macOS, systemd elsewhere."""
    return "launchd" if sys.platform == "darwin" else "systemd"


def default_exe() -> str:
    """The ``vllmmlxd`` script next to this interpreter (a venv install), else the one on PATH."""
    # sys.executable is not resolved: a venv's python is a symlink out of the venv.
    beside = Path(sys.executable).parent / "vllmmlxd"
    if beside.exists():
        return str(beside)
    return shutil.which("vllmmlxd") or str(beside)


def default_state_dir(kind: Kind, user: bool) -> Path:
    """Where the service keeps its state when the caller names none."""
    if user:
        if kind == "launchd":
            return Path.home() / "Library" / "Application Support" / "vllmmlxd"
        return Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state") / "vllmmlxd"
    return Path("/Library/Application Support/vllmmlxd") if kind == "launchd" else Path("/var/lib/vllmmlxd")


def default_daemon_account(environ: dict[str, str] | None = None) -> str:
    """Who a system LaunchDaemon runs as: the admin who ran ``sudo``, else the caller; never root.

    It owns the state and log dirs, so the same admin can reach the control socket without sudo.
    """
    environ = dict(os.environ) if environ is None else environ
    name = environ.get("SUDO_USER") if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    if not name or name == "root":
        raise ValueError(
            "a system LaunchDaemon must not run as root: run install-service with sudo from the "
            "account it should run as (or --user for a LaunchAgent)"
        )
    return name


def default_log_dir(user: bool) -> Path:
    """launchd's log directory (systemd logs to the journal)."""
    return Path.home() / "Library" / "Logs" / "vllmmlxd" if user else Path("/Library/Logs/vllmmlxd")


def install_paths(kind: Kind, user: bool) -> Path:
    """Where the unit or plist goes."""
    if kind == "systemd":
        folder = Path.home() / ".config/systemd/user" if user else Path("/etc/systemd/system")
        return folder / UNIT_NAME
    if kind == "launchd":
        folder = Path.home() / "Library/LaunchAgents" if user else Path("/Library/LaunchDaemons")
        return folder / f"{LABEL}.plist"
    raise ValueError(f"unknown service kind {kind!r}")


def _launchd_domain(user: bool) -> str:
    return f"gui/{os.getuid()}" if user else "system"


def enable_commands(kind: Kind, user: bool, path: Path | None = None) -> list[str]:
    """Shell commands that load and start the installed service (each safe for shlex.split)."""
    path = path or install_paths(kind, user)
    if kind == "systemd":
        ctl = "systemctl --user" if user else "systemctl"
        return [f"{ctl} daemon-reload", f"{ctl} enable --now vllmmlxd"]
    domain = _launchd_domain(user)
    return [f"launchctl enable {domain}/{LABEL}", f"launchctl bootstrap {domain} {shlex.quote(str(path))}"]


def disable_commands(kind: Kind, user: bool) -> list[str]:
    """Shell commands that stop and unload the service (run before re-installing a plist)."""
    if kind == "systemd":
        return [f"systemctl{' --user' if user else ''} disable --now vllmmlxd"]
    return [f"launchctl bootout {_launchd_domain(user)}/{LABEL}"]


@dataclass(frozen=True)
class ServiceFile:
    """A rendered service file, where it goes, the directories it needs and how to enable it."""

    kind: Kind
    user: bool
    path: Path
    content: bytes
    dirs: tuple[Path, ...]
    commands: tuple[str, ...]
    owner: str | None = None  # the account ``dirs`` are handed to (a LaunchDaemon's UserName)


def make_service_file(
    kind: Kind,
    user: bool,
    config: Path,
    *,
    exe: str | None = None,
    state_dir: Path | None = None,
    log_dir: Path | None = None,
    path: Path | None = None,
    account: str | None = None,
) -> ServiceFile:
    """Render the file for this installation, filling in defaults; writes nothing.

    ``account`` is who a system LaunchDaemon runs as (default: :func:`default_daemon_account`).
    """
    config = Path(os.path.abspath(Path(config).expanduser()))
    exe = os.path.abspath(exe or default_exe())
    state = Path(os.path.abspath(Path(state_dir).expanduser())) if state_dir else default_state_dir(kind, user)
    path = path or install_paths(kind, user)
    owner = None  # systemd gives the unit its account itself
    if kind == "systemd":
        content = render_systemd_unit(exe, config, state, user).encode()
        # StateDirectory= creates /var/lib/<name> itself; anywhere else the dir must exist first.
        dirs: tuple[Path, ...] = () if (not user and _under_var_lib(state)) else (state,)
    else:
        logs = Path(os.path.abspath(Path(log_dir).expanduser())) if log_dir else default_log_dir(user)
        owner = None if user else (account or default_daemon_account())
        content = render_launchd_plist(exe, config, state, logs, user_name=owner)
        dirs = (state, logs)  # launchd creates neither
    return ServiceFile(kind, user, path, content, dirs, tuple(enable_commands(kind, user, path)), owner)


def write_service_file(service: ServiceFile) -> Path:
    """Create the directories it needs (handed to ``service.owner``) and write the file atomically (mode 0644)."""
    for directory in (*service.dirs, service.path.parent):
        directory.mkdir(parents=True, exist_ok=True)
    if service.owner:
        # Made by root under sudo: the unprivileged daemon must be able to write its state and logs.
        for directory in service.dirs:
            shutil.chown(directory, user=service.owner)
    fd, tmp = tempfile.mkstemp(dir=service.path.parent, prefix=f".{service.path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(service.content)
        os.chmod(tmp, 0o644)
        os.replace(tmp, service.path)
    except BaseException:
        os.unlink(tmp)
        raise
    return service.path


# A system unit's PrivateTmp=yes gives the service empty ones of its own.
PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))
INSTALL_HINT = "install vllmmlxd where the service can reach it (docs/operations.md: Where to install for a service)"


def _mode(path: Path) -> int | None:
    try:
        return path.stat().st_mode
    except OSError:
        return None


def service_paths(exe: str, config: Path) -> dict[str, Path]:
    """The files a service must reach, by what they are: its executable, the Python that runs it
    (a venv script's ``#!`` line, resolved: a venv's python links to its base interpreter), its config."""
    paths = {"the executable": Path(exe)}
    try:
        with open(exe, "rb") as f:
            first = f.readline(4096)
    except OSError:
        first = b""
    if first.startswith(b"#!") and first[2:].split():
        python = Path(first[2:].split()[0].decode(errors="replace"))
        paths["its Python"] = Path(os.path.realpath(python))
    paths["the config"] = Path(config)
    return paths


def reach_warnings(
    kind: Kind, user: bool, paths: dict[str, Path], mode_of: Callable[[Path], int | None] = _mode
) -> list[str]:
    """Why a system unit's account could not reach ``paths``: under /tmp (hidden by PrivateTmp=yes),
    or inside a folder others may not enter (a 0700 home: the service runs as an account of its own).

    Only a system systemd unit runs as another account with a private /tmp; ``mode_of`` gives a
    path's st_mode (None: missing, then nothing is said about it)."""
    if kind != "systemd" or user:
        return []
    out = []
    for what, path in paths.items():
        path = Path(os.path.normpath(path))
        tmp = next((t for t in PRIVATE_TMP if path.is_relative_to(t)), None)
        if tmp is not None:
            out.append(
                f"{what} {path} is under {tmp}, which the unit's PrivateTmp=yes hides from the service: "
                f"it would not start; {INSTALL_HINT}"
            )
            continue
        for folder in reversed(path.parents[:-1]):  # from the top down, / left out
            mode = mode_of(folder)
            if mode is None:
                break
            if not mode & stat.S_IXOTH:
                out.append(
                    f"{what} {path} is inside {folder} (mode {stat.S_IMODE(mode):o}), which other accounts "
                    f"cannot enter, and the service runs as an account of its own (DynamicUser=yes, or User=): it could not "
                    f"reach it; {INSTALL_HINT}"
                )
                break
    return out


def render_templates() -> dict[str, bytes]:
    """The files under service/, by name: these renderers applied to the template installs."""
    return {
        UNIT_NAME: render_systemd_unit(**TEMPLATE_SYSTEMD).encode(),
        f"{LABEL}.plist": render_launchd_plist(**TEMPLATE_LAUNCHD),
    }


if __name__ == "__main__":  # python -m vllmmlxd.service_files service/
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "service")
    for name, data in render_templates().items():
        (dest / name).write_bytes(data)
        print(dest / name)
