"""``vllmmlxctl doctor``: one command whose report a user pastes into an issue. Versions, the device,
the state directory, the config's check, the service, its ports, then the engine itself on this
machine: a small model through the batch, the prefix cache, speculation and the quantized KV
cache, each compared token for token with mlx-lm's own generation (engine/selftest/, run in a
child process: this command never imports mlx). Exit 0 when nothing failed (warnings allowed)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from vllmmlxd import __version__
from vllmmlxd.ctl import doctor_checks as dc
from vllmmlxd.ctl import doctor_probe as probe
from vllmmlxd.ctl import exit_codes
from vllmmlxd.ctl.client import ControlClient, ControlRequestError, DaemonUnreachable, resolve_socket
from vllmmlxd.ctl.doctor_render import render_text, to_json
from vllmmlxd.errors import VllmmlxdError
from vllmmlxd.version import describe

DEFAULT_MODEL = "builtin:tiny"
SELFTEST_TIMEOUT_S = 900.0  # a real model is built or converted once before it loads


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """The ``doctor`` subcommand and its options."""
    p = sub.add_parser(
        "doctor", parents=[common], help="check this install and prove the engine against mlx-lm on this machine"
    )
    p.add_argument(
        "--model",
        metavar="NAME",
        default=DEFAULT_MODEL,
        help="the self-test's model: a builtin, an entry of the config, a store name or a path (default builtin:tiny)",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    """Run every check; print the report; exit ``DOCTOR_FAILED`` when one failed (the report names it)."""
    header = (
        f"vllmmlxctl doctor: vllmmlxd {describe()} on {platform.system()} {platform.machine()}, "
        f"{datetime.now(UTC).strftime('%Y-%m-%d %H:%M UTC')}"
    )
    checks = dc.version_checks(probe.versions(), describe(), f"{platform.python_version()} ({sys.executable})")
    status, socket, reason = _daemon_status(args)
    config_file = _find_config(args, status)
    config, config_checks = _config_checks(config_file)
    state_dir = _state_dir(config)
    selftest, engine = _selftest(args, config, state_dir)
    if sys.platform == "darwin":
        checks += dc.macos_device_checks((selftest or {}).get("device"), probe.wired_limit_mb())
    else:
        blas = (selftest or {}).get("blas")
        cores = probe.usable_cores()
        candidates = probe.blas_candidates() if blas is None else []
        checks += dc.linux_device_checks(cores, os.cpu_count() or cores, platform.machine(), blas, candidates)
    checks.append(dc.state_check(state_dir, *probe.state_dir_facts(state_dir)))
    checks += config_checks
    checks.append(dc.daemon_check(socket, status, reason, __version__))
    from vllmmlxd.service_files import LABEL, UNIT_NAME

    tool, raw = probe.service_answers(sys.platform, UNIT_NAME, LABEL)
    manager = "launchd" if tool == "launchctl" else "systemd"
    checks.append(dc.manager_check({s: dc.service_state(manager, s, rc, out) for s, (rc, out) in raw.items()}, tool))
    checks += _port_checks(config, status)
    checks += engine
    if args.json:
        print(json.dumps(to_json(header, checks, selftest), indent=2))
    else:
        print(render_text(header, checks))
    return exit_codes.DOCTOR_FAILED if dc.failed(checks) else exit_codes.OK


def _daemon_status(args: argparse.Namespace) -> tuple[dict[str, Any] | None, Path, str]:
    """The daemon's ``/v1/status`` as data (None when nothing answers), its socket, and why not."""
    try:
        socket = resolve_socket(getattr(args, "socket", None), getattr(args, "config", None))
    except (ValueError, VllmmlxdError, OSError) as exc:
        return None, Path("?"), str(exc)
    try:
        with ControlClient(socket, connect_timeout=1.0) as client:
            return client.status().model_dump(mode="json"), socket, ""
    except DaemonUnreachable as exc:
        return None, socket, exc.reason
    except (ControlRequestError, VllmmlxdError, ValueError) as exc:
        return None, socket, str(exc)


def _find_config(args: argparse.Namespace, status: dict[str, Any] | None) -> Path | None:
    """``--config``, else the running daemon's, else the first of the usual places that exists."""
    given = getattr(args, "config", None)
    if given:
        return Path(given).expanduser()
    running = (status or {}).get("daemon", {}).get("config_path")
    if running:
        return Path(running)
    return next((p for p in dc.config_candidates(os.environ, Path.home(), sys.platform) if p.is_file()), None)


def _config_checks(file: Path | None) -> tuple[Any, list[dc.Check]]:
    """The config (None when none or invalid) and its check: what ``vllmmlxctl check`` says of it."""
    if file is None:
        return None, [dc.Check("config", "config", "skip", "none given or found (--config FILE)")]
    from vllmmlxd.config.load import load_config
    from vllmmlxd.errors import ConfigError
    from vllmmlxd.paths import resolve_state_dir
    from vllmmlxd.store.layout import not_downloaded, pull_hint
    from vllmmlxd.supervisor.memory import load_memory_plan

    try:
        config = load_config(file).config
    except ConfigError as exc:
        return None, [dc.Check("config", "config", "fail", str(exc), data={"file": str(file)})]
    memory = load_memory_plan(config, resolve_state_dir(config.daemon.state_dir))
    if not memory.fits:
        return config, [dc.Check("config", "config", "fail", f"{file}: {memory.refusal()}", data={"file": str(file)})]
    out = [dc.Check("config", "config", "ok", f"{file}: {len(config.models)} model(s)", data={"file": str(file)})]
    state_dir = resolve_state_dir(config.daemon.state_dir)
    for name, entry in config.models.items():
        repo = not_downloaded(getattr(entry, "model", ""), state_dir)
        if repo and not getattr(entry, "download", False):
            out.append(dc.Check("config", name, "warn", f"{pull_hint(repo)} (or set download: true on {name})"))
    return config, out


def _state_dir(config: Any) -> Path:
    from vllmmlxd.paths import resolve_state_dir

    return resolve_state_dir(config.daemon.state_dir if config is not None else None)


def _port_checks(config: Any, status: dict[str, Any] | None) -> list[dc.Check]:
    """Each address the config listens on, against a test bind and the daemon's own."""
    if config is None:
        return []
    from vllmmlxd.config.schema import ModelConfig

    wanted = [(f"model {n}", e.host, e.port) for n, e in config.models.items() if isinstance(e, ModelConfig)]
    if config.gateway is not None:
        wanted += [("gateway", host, port) for host, port in config.gateway.listeners()]
    held: dict[tuple[str, int], str] | None = None
    if status is not None:
        held = {(m["host"], m["port"]): f"model {m['name']}" for m in status.get("models", [])}
        gateway = status.get("gateway")
        if gateway and config.gateway is not None:
            held.update({addr: "gateway" for addr in config.gateway.listeners()})
    return [dc.port_check(owner, host, port, probe.bind_error(host, port), held) for owner, host, port in wanted]


def _selftest(args: argparse.Namespace, config: Any, state_dir: Path) -> tuple[dict[str, Any] | None, list[dc.Check]]:
    """The engine self-test on ``--model``: an entry of the config runs its model with its BLAS."""
    model, blas = args.model, "auto"
    entry = config.models.get(model) if config is not None else None
    if entry is not None and hasattr(entry, "model"):
        model, blas = entry.model, getattr(entry, "blas", "auto")
    result, error, seconds = probe.run_selftest(model, state_dir, blas, SELFTEST_TIMEOUT_S)
    return result, dc.selftest_checks(result, error, seconds)
