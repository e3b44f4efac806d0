"""``vllmmlxctl doctor``'s decisions: plain values in, one ``Check`` each out. No I/O here (the
shells in doctor_probe.py read the machine), so every platform's path is tested on any."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vllmmlxd.extras import install_hint

LEVELS = ("ok", "warn", "fail", "skip")
GiB = 1024**3
DISK_FAIL, DISK_WARN = 1 * GiB, 10 * GiB  # a model's weights are gigabytes; the KV disk tier wants room too
FAST_BLAS_HINT = install_hint("linux-fast")
# The optional distributions, the extra that brings each, and what it serves.
OPTIONAL = (("mlx-vlm", "vision", "images"), ("mlx-audio", "audio", "speech to text"))


@dataclass
class Check:
    """One line of the report: ``part.name``, its level, why, and how long it took when timed."""

    part: str
    name: str
    level: str
    detail: str
    seconds: float | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.part}.{self.name}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def failed(checks: Iterable[Check]) -> list[str]:
    """The checks that failed, by ``part.name``: what the exit code and the last line report."""
    return [c.key for c in checks if c.level == "fail"]


def gib(n: float) -> str:
    return f"{n / GiB:.1f} GiB"


# versions


def version_checks(versions: Mapping[str, str | None], vllmmlxd: str, python: str) -> list[Check]:
    """vllmmlxd (with its commit), Python, and the distributions it runs on (None: not installed).
    MLX and mlx-lm are needed; mlx-vlm serves images only, mlx-audio speech only."""
    out = [Check("versions", "vllmmlxd", "ok", vllmmlxd), Check("versions", "python", "ok", python)]
    for name in ("mlx", "mlx-lm"):
        found = versions.get(name)
        out.append(
            Check("versions", name, "ok", found)
            if found
            else Check("versions", name, "fail", f"not installed: pip install '{name}' (vllmmlxd needs it)")
        )
    backend = next((f"{b} {versions[b]}" for b in ("mlx-metal", "mlx-cpu", "mlx-cuda") if versions.get(b)), None)
    if backend and versions.get("mlx"):
        out[2].detail += f" ({backend})"
    for name, extra, serves in OPTIONAL:
        found = versions.get(name)
        out.append(Check("versions", name, "ok", found or f"not installed ({serves} only): {install_hint(extra)}"))
    return out


# device


def wired_limit_advice(memory_bytes: int, recommended_bytes: int) -> int:
    """A wired-memory limit in MB worth setting: all but 8 GiB or an eighth of memory (the larger)
    for macOS and other apps, never below what Metal recommends by default."""
    reserve = max(8 * GiB, memory_bytes // 8)
    return max(memory_bytes - reserve, recommended_bytes) // (1024 * 1024)


def macos_device_checks(device: Mapping[str, Any] | None, wired_limit_mb: int | None) -> list[Check]:
    """The Metal GPU as MLX sees it (``mx.device_info()``, read by the self-test's process) and the
    wired-memory limit (``sysctl iogpu.wired_limit_mb``; 0 is macOS's default)."""
    if not device:
        return [Check("device", "gpu", "warn", "unknown: the engine self-test did not report its device")]
    if not device.get("metal"):
        why = "MLX sees no Metal GPU and runs on the CPU (is mlx-metal installed? pip install --force-reinstall mlx)"
        return [Check("device", "gpu", "fail", why, data=dict(device))]
    memory = int(device.get("memory_size") or 0)
    recommended = int(device.get("max_recommended_working_set_size") or 0)
    name = device.get("device_name") or "Metal GPU"
    gpu = Check(
        "device",
        "gpu",
        "ok",
        f"{name}, {gib(memory)} memory, {gib(recommended)} recommended working set",
        data=dict(device),
    )
    suggest = wired_limit_advice(memory, recommended) if memory else 0
    raise_it = f"raise it with `sudo sysctl iogpu.wired_limit_mb={suggest}` (until reboot)"
    if wired_limit_mb is None:
        wired = Check("device", "wired_limit", "warn", "unknown: `sysctl iogpu.wired_limit_mb` did not answer")
    elif wired_limit_mb == 0:
        detail = f"macOS's default (models may wire about {gib(recommended)})"
        wired = Check(
            "device", "wired_limit", "ok", f"{detail}; {raise_it}" if suggest * 1024 * 1024 > recommended else detail
        )
    else:
        detail = f"{wired_limit_mb} MB (set by hand)"
        wired = Check("device", "wired_limit", "ok", f"{detail}; {raise_it}" if suggest > wired_limit_mb else detail)
    wired.data = {"wired_limit_mb": wired_limit_mb, "suggested_mb": suggest}
    return [gpu, wired]


def linux_device_checks(
    cores: int, total_cores: int, machine: str, blas: Mapping[str, Any] | None, candidates: list[str]
) -> list[Check]:
    """The cores this process may use and the BLAS MLX multiplies with: the one the self-test ran
    with (chosen as a worker chooses it), else the libraries a worker would try."""
    cpu = Check("device", "cpu", "ok", f"{machine}, {cores} of {total_cores} cores usable", data={"cores": cores})
    if blas is None:
        found = ", ".join(candidates) or "none"
        level = "ok" if candidates else "warn"
        hint = "" if candidates else f" (the bundled reference BLAS is 10-30x slower: {FAST_BLAS_HINT})"
        return [cpu, Check("device", "blas", level, f"found {found}{hint}", data={"candidates": candidates})]
    name, warning = blas.get("name", "?"), blas.get("warning")
    detail = f"{name} ({blas.get('path')}), {blas.get('threads')} thread(s)"
    if name == "bundled":
        return [
            cpu,
            Check("device", "blas", "warn", f"{detail}: 10-30x slower than MKL: {FAST_BLAS_HINT}", data=dict(blas)),
        ]
    return [
        cpu,
        Check(
            "device",
            "blas",
            "warn" if warning else "ok",
            f"{detail}: {warning}" if warning else detail,
            data=dict(blas),
        ),
    ]


# state, config, service, ports


def state_check(path: Path, exists: bool, writable: bool, free_bytes: int | None) -> Check:
    """The state directory (models, sockets, logs, the KV disk tier) and the free disk under it."""
    data = {"path": str(path), "exists": exists, "free_bytes": free_bytes}
    where = f"{path}{'' if exists else ' (created at the first start)'}"
    if exists and not writable:
        return Check("state", "state_dir", "fail", f"{where}: not writable by this user", data=data)
    if free_bytes is None:
        return Check("state", "state_dir", "warn", f"{where}: free disk unknown", data=data)
    level = "fail" if free_bytes < DISK_FAIL else "warn" if free_bytes < DISK_WARN else "ok"
    return Check("state", "state_dir", level, f"{where}, {gib(free_bytes)} free", data=data)


def config_candidates(environ: Mapping[str, str], home: Path, platform: str) -> list[Path]:
    """Where a config is looked for when none is given and no daemon says: the user's, Homebrew's,
    the system's (the paths `vllmmlxctl install-service` and the formula use)."""
    base = Path(environ.get("XDG_CONFIG_HOME") or home / ".config")
    brew = [Path(environ["HOMEBREW_PREFIX"])] if environ.get("HOMEBREW_PREFIX") else []
    if platform == "darwin":
        brew += [Path("/opt/homebrew"), Path("/usr/local")]
    found = [base / "vllmmlxd" / "config.yaml", *(p / "etc" / "vllmmlxd" / "config.yaml" for p in brew)]
    return list(dict.fromkeys([*found, Path("/etc/vllmmlxd/config.yaml")]))


def daemon_check(socket: Path, status: Mapping[str, Any] | None, reason: str, my_version: str) -> Check:
    """Whether the daemon answers on its control socket; not running is a warning, not a failure."""
    if status is None:
        return Check("service", "daemon", "warn", f"not answering on {socket}: {reason}", data={"socket": str(socket)})
    models = status.get("models", [])
    ready = sum(1 for m in models if m.get("state") == "ready")
    daemon = status.get("daemon", {})
    detail = f"pid {daemon.get('pid')} on {socket}, {ready} of {len(models)} model(s) ready, config {daemon.get('config_path')}"
    version = daemon.get("version")
    if version and version != my_version:
        return Check("service", "daemon", "warn", f"{detail}; it runs {version}, this vllmmlxctl is {my_version}")
    return Check("service", "daemon", "ok", detail, data={"socket": str(socket), "version": version})


def service_state(manager: str, scope: str, rc: int | None, out: str) -> str | None:
    """A service manager's answer in one word: ``active``, ``failed``, ``inactive``, ``loaded``,
    ``unknown`` (the tool failed), or None when it knows no such service or the tool is absent
    (``rc`` None)."""
    text = out.strip()
    if rc is None:
        return None
    if manager == "systemd":  # `systemctl show -p LoadState,ActiveState`: an unknown unit is "not-found"
        fields = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        if rc != 0:  # systemctl itself could not answer (no user session bus, no systemd as init)
            return "unknown"
        if fields.get("LoadState") in (None, "not-found"):
            return None
        return fields.get("ActiveState") or "loaded"
    if rc != 0:  # launchctl print: no such service in that domain
        return None
    state = next(
        (line.split("=", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("state =")), ""
    )
    return state or "loaded"


def manager_check(answers: Mapping[str, str | None], tool: str | None) -> Check:
    """The service manager's view of vllmmlxd, per scope (``user``, ``system``, ``homebrew``)."""
    if tool is None:
        return Check("service", "manager", "skip", "no systemctl or launchctl here")
    known = {scope: state for scope, state in answers.items() if state}
    if known and set(known.values()) == {"unknown"}:
        return Check("service", "manager", "skip", f"{tool} did not answer (no session bus, or not the init system)")
    if not known:
        return Check("service", "manager", "ok", f"{tool}: not installed as a service (vllmmlxctl install-service)")
    detail = ", ".join(f"{scope} {state}" for scope, state in known.items())
    level = "warn" if any(s == "failed" for s in known.values()) else "ok"
    return Check("service", "manager", level, f"{tool}: {detail}", data=dict(known))


def port_check(
    owner: str, host: str, port: int, bind_error: str | None, daemon_ports: Mapping[tuple[str, int], str] | None
) -> Check:
    """One listening address of the config: free, held by this daemon, or held by something else
    (where the daemon could not listen). ``bind_error``: None when a test bind succeeded."""
    where = f"{host}:{port} ({owner})"
    data = {"host": host, "port": port, "owner": owner}
    if bind_error is None:
        return Check("ports", str(port), "ok", f"{where}: free", data={**data, "state": "free"})
    held_by = (daemon_ports or {}).get((host, port))
    if held_by:
        return Check(
            "ports", str(port), "ok", f"{where}: held by this daemon ({held_by})", data={**data, "state": "daemon"}
        )
    if bind_error == "in use":
        hint = f"`lsof -nP -iTCP:{port} -sTCP:LISTEN` or `ss -ltnp 'sport = :{port}'` names it"
        return Check(
            "ports", str(port), "fail", f"{where}: held by another process ({hint})", data={**data, "state": "other"}
        )
    return Check("ports", str(port), "warn", f"{where}: cannot test: {bind_error}", data={**data, "state": "unknown"})


# the engine self-test


def selftest_checks(result: Mapping[str, Any] | None, error: str | None, seconds: float) -> list[Check]:
    """The self-test's process's answer (``python -m vllmmlxd.engine.selftest``), one check per path."""
    if result is None or result.get("error"):
        why = (result or {}).get("error") or error or "no answer"
        return [Check("engine", "selftest", "fail", why, round(seconds, 3))]
    head = Check(
        "engine",
        "load",
        "ok",
        f"{result.get('model')} loaded: {result.get('precision')}, prefix cache in {result.get('prefix_cache')}, "
        f"mlx-lm's references in {result.get('reference_s')} s",
        result.get("load_s"),
        data={k: result.get(k) for k in ("model", "precision", "prefix_cache", "rounding", "kv_rounding")},
    )
    out = [head]
    for path in result.get("paths", []):
        level = path.get("level") if path.get("level") in LEVELS else "fail"
        extra = {k: v for k, v in path.items() if k not in ("name", "level", "detail", "seconds")}
        out.append(
            Check("engine", path.get("name", "?"), level, path.get("detail", ""), path.get("seconds"), data=extra)
        )
    return out
