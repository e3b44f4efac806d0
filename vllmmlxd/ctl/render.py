"""Text for people: the status table and the one-line summaries of ``vllmmlxctl``. Pure functions.
The store's table and its pulls' progress are in ``render_store``."""

from __future__ import annotations

from collections.abc import Sequence

from vllmmlxd.control.protocol import ActionResponse, McpServerStatus, ModelStatus, ReloadResponse, StatusResponse
from vllmmlxd.ctl.formats import format_clock, format_duration, render_table
from vllmmlxd.ctl.render_store import (  # re-exported: what vllmmlxctl prints of the store and its pulls
    MODELS_HEADERS,
    ended,
    format_size,
    pull_progress,
    render_models,
    render_pull_bar,
    render_pull_end,
)

STATUS_HEADERS = (
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
)
# States worth explaining under the table with the worker's last stderr lines.
_EXPLAINED = ("failed", "backoff", "unreachable")
# States in which a model answers: a lazy model unloaded loads on its next request.
_SERVING = ("ready", "idle", "unloaded")
_INDENT = "    "


def _row(m: ModelStatus, groups: bool = False) -> tuple[str, ...]:
    pid = "-" if m.pid is None else str(m.pid)
    return (
        m.name,
        *((getattr(m, "group", None) or "-",) if groups else ()),
        _state(m),
        pid,
        str(m.port),
        _keys(m),
        format_duration(m.uptime_s),
        str(m.restarts),
        _or_dash(m.running),
        _or_dash(m.waiting),
        _or_dash(m.tokens_per_s),
        _cache(m),
        m.blas or "-",
        _or_dash(m.threads),
        m.cpus or "-",
    )


def _state(m: ModelStatus) -> str:
    """``ready``; ``idle 42s`` for a lazy model; ``downloading 37%`` for one whose model is on its way;
    ``ready*`` for an upstream (explained under the table)."""
    idle = getattr(m, "idle_s", None)
    if m.state == "idle" and idle is not None:
        return f"idle {format_duration(idle)}"
    download = getattr(m, "download", None)
    if m.state == "downloading" and download is not None and download.percent is not None:
        return f"downloading {download.percent:g}%"
    return m.state + ("*" if getattr(m, "upstream", None) else "")


def _lazy_lines(models: Sequence[ModelStatus]) -> list[str]:
    """``qwen: lazy, unloaded after 15m00s idle``; ``far*: served by http://studio-2.local:8001``."""
    lines = []
    for m in models:
        if getattr(m, "upstream", None):
            lines.append(f"{m.name}*: served by {m.upstream}")
        elif getattr(m, "load", "eager") == "lazy":
            after = getattr(m, "idle_unload_s", None)
            lines.append(
                f"{m.name}: lazy (loads on its first request through the gateway)"
                + (f", unloaded after {format_duration(after)} idle" if after else "")
            )
    return lines


def _group_lines(status: StatusResponse) -> list[str]:
    """``group tiny: ready; a ready (2 running, 0 waiting), b backoff`` for each replica set."""
    lines = []
    for g in getattr(status, "groups", None) or ():
        members = [
            f"{m.name} {m.state}"
            + (f" ({m.running} running, {m.waiting or 0} waiting)" if m.running is not None else "")
            for m in g.members
        ]
        lines.append(f"group {g.name}: {g.state}; " + ", ".join(members))
    return lines


def _rank_lines(models: Sequence[ModelStatus]) -> list[str]:
    """``s: pipeline over 2 ranks (ring)`` and one line per rank: host, pid, state, share, step time."""
    lines = []
    for m in models:
        ranks = getattr(m, "ranks", None)
        if not ranks:
            continue
        d = m.distributed or {}
        lines.append(f"{m.name}: {d.get('parallel')} over {d.get('world')} ranks ({d.get('backend')})")
        for r in ranks:
            timing = ", ".join(
                f"{label} {value:g} ms"
                for label, value in (("step", r.step_ms), ("wait", r.wait_ms))
                if value is not None
            )
            lines.append(
                f"  rank {r.rank}  {r.host}  pid {r.pid if r.pid is not None else '-'}  {r.state}"
                + (f"  {r.share}" if r.share else "")
                + (f"  ({timing})" if timing else "")
            )
    return lines


def _gateway_line(status: StatusResponse) -> list[str]:
    g = getattr(status, "gateway", None)
    if g is None:
        return []
    host = f"[{g.host}]" if ":" in g.host else g.host
    where = f"http://{host}:{g.port}/" + ("  (web page at /)" if g.ui else "")
    pid = "" if g.pid is None else f", pid {g.pid}"
    line = f"gateway: {g.state}{pid}, {where}, restarts {g.restarts}"
    return [line] + ([_INDENT + g.last_error.splitlines()[-1]] if g.last_error and g.state != "ready" else [])


def _keys(m: ModelStatus) -> str:
    """Who may call: ``open``, the key names (``alice,ci``), or ``none`` for an entry that lists no key."""
    keys = getattr(m, "keys", None)  # absent from an older daemon's answer
    if keys is None:
        return "open"
    return ",".join(keys) or "none"


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _cache(m: ModelStatus) -> str:
    """The prefix cache's use against its budget, and its disk tier's when it has one: ``12/4821M+1.2/20G``."""
    if m.cache_mb is None or m.cache_budget_mb is None:
        return "-"
    memory = f"{m.cache_mb:g}/{m.cache_budget_mb:g}M"
    disk, budget = getattr(m, "cache_disk_mb", None), getattr(m, "cache_disk_budget_mb", None)
    if disk is None or budget is None:
        return memory
    return f"{memory}+{disk / 1024:.3g}/{budget / 1024:g}G"


def _blas_lines(models: Sequence[ModelStatus]) -> list[str]:
    """Which library each BLAS name is, and why a worker is not on the one it was asked for."""
    paths = {m.blas: m.blas_path for m in models if m.blas and m.blas_path}
    lines = [f"blas {name}: {path}" for name, path in sorted(paths.items())]
    lines += [f"{m.name}: {m.blas_warning}" for m in models if m.blas_warning]
    return lines


def _embedding_lines(models: Sequence[ModelStatus]) -> list[str]:
    """``llama embeds with all-minilm-l6-v2: 12 requests, 340 inputs`` for each entry with an embedding model."""
    return [
        f"{m.name} embeds with {m.embedding_model}: {_or_dash(getattr(m, 'embedding_requests', None))} requests, "
        f"{_or_dash(getattr(m, 'embedding_inputs', None))} inputs"
        for m in models
        if getattr(m, "embedding_model", None)
    ]


def _speculation_lines(models: Sequence[ModelStatus]) -> list[str]:
    """``llama speculates (prompt-lookup): 81% of 1,204 drafted tokens accepted``, or why it does not."""
    lines = []
    for m in models:
        spec = getattr(m, "speculative", None)
        if spec and spec.get("off"):
            lines.append(f"{m.name} does not speculate: {spec['off']}")
        elif spec:
            drafted = spec.get("drafted_tokens", 0)
            rate = (
                f"{spec.get('acceptance_rate', 0):.0%} of {drafted:,} drafted tokens accepted"
                if drafted
                else "nothing drafted yet"
            )
            lines.append(f"{m.name} speculates ({spec.get('method')}): {rate}")
    return lines


def _kv_lines(models: Sequence[ModelStatus]) -> list[str]:
    """``llama KV: 412.5 of 6,144 MB reserved by 3 running, 5 waiting for room`` for each model
    with a KV budget (the waiting part only while some wait)."""
    lines = []
    for m in models:
        kv = getattr(m, "kv", None)
        if not kv or kv.get("budget_mb") is None:
            continue
        waiting = kv.get("waiting") or 0
        lines.append(
            f"{m.name} KV: {kv.get('reserved_mb') or 0:,.1f} of {kv['budget_mb']:,.1f} MB reserved by "
            f"{kv.get('running') or 0} running" + (f", {waiting} waiting for room" if waiting else "")
        )
    return lines


def _explain(m: ModelStatus) -> list[str]:
    exit_code = "" if m.last_exit_code is None else f" (exit {m.last_exit_code})"
    lines = [f"{m.name} {m.state}{exit_code}:"]
    lines += [_INDENT + line for line in (m.last_error or "").splitlines()]
    return lines


def _with_rest(first: str, text: str) -> list[str]:
    """``first`` + the text's first line, its other lines indented beneath."""
    head, *rest = text.splitlines() or [""]
    return [first + head] + [_INDENT + line for line in rest]


def _mcp_lines(models: Sequence[ModelStatus]) -> list[str]:
    """``llama mcp: files ready (3 tools), search failed: connection refused`` for each entry with MCP servers."""
    lines = []
    for m in models:
        servers = getattr(m, "mcp", None) or []
        if servers:
            lines.append(f"{m.name} mcp: " + ", ".join(_mcp_server(s) for s in servers))
    return lines


def _mcp_server(s: McpServerStatus) -> str:
    if s.state == "ready":
        restarted = s.connects - 1 if s.connects else 0
        again = f"; restarted {restarted}x, last: {s.last_error}" if restarted > 0 and s.last_error else ""
        return f"{s.name} ready ({s.tools} tool{'' if s.tools == 1 else 's'}{again})"
    if s.state in ("failed", "starting") and s.last_error:
        return f"{s.name} {s.state}: {s.last_error}"
    return f"{s.name} {s.state}"


def render_status(status: StatusResponse, now: float | None = None) -> str:
    """The model table, why failed models failed, then the daemon and last-reload footer."""
    # A GROUP column only where some entry is in a replica set: other tables read as before.
    grouped = any(getattr(m, "group", None) for m in status.models)
    headers = (STATUS_HEADERS[0], "GROUP", *STATUS_HEADERS[1:]) if grouped else STATUS_HEADERS
    rows = [_row(m, grouped) for m in status.models]
    lines = [render_table(headers, rows)] if status.models else ["no models"]
    for m in status.models:
        if m.state in _EXPLAINED and m.last_error:
            lines += ["", *_explain(m)]
    blas = _blas_lines(status.models)
    if blas:
        lines += ["", *blas]
    embedding = _embedding_lines(status.models)
    if embedding:
        lines += ["", *embedding]
    seeing = [m.name for m in status.models if getattr(m, "vision", None)]
    if seeing:
        lines += ["", f"vision (takes images): {', '.join(seeing)}"]
    kv = _kv_lines(status.models)
    if kv:
        lines += ["", *kv]
    drafting = _speculation_lines(status.models)
    if drafting:
        lines += ["", *drafting]
    mcp = _mcp_lines(status.models)
    if mcp:
        lines += ["", *mcp]
    extra = (
        _group_lines(status)
        + _rank_lines(status.models)
        + _lazy_lines(status.models)
        + _pull_lines(status)
        + _gateway_line(status)
    )
    if extra:
        lines += ["", *extra]
    d = status.daemon
    lines += [
        "",
        f"daemon: pid {d.pid}, up {format_duration(d.uptime_s)}, version {d.version}, "
        f"config {d.config_path} ({d.config_hash[:12]})",
    ]
    if getattr(d, "config_missing", False):
        lines.append(f"config file MISSING: {d.config_path} was deleted; the running config stays until it is back")
    r = d.last_reload
    if r is None:
        lines.append("last reload: none")
    elif r.ok:
        lines.append(f"last reload: ok at {format_clock(r.at, now)}")
    else:
        lines += _with_rest(f"last reload: FAILED at {format_clock(r.at, now)}: ", r.error or "unknown error")
    return "\n".join(lines)


def _pull_lines(status: StatusResponse) -> list[str]:
    """``pulling org/name: 37% of 4.27 GB, 12.5 MB/s, 2m48s left`` for each pull under way."""
    return [f"pulling {p.repo}: {pull_progress(p)}" for p in getattr(status, "pulls", None) or () if not ended(p)]


def all_ready(status: StatusResponse) -> bool:
    """True when every model serves (``ready``, or a lazy one ``idle`` or ``unloaded``: it loads on demand)
    and the gateway, if any, is ready (and so ``status`` exits 0)."""
    gateway = getattr(status, "gateway", None)
    return all(m.state in _SERVING for m in status.models) and (gateway is None or gateway.state == "ready")


# How each entry's change reads, and the order entries are listed in.
_ENTRY_ORDER = ("new worker", "apply live", "added", "removed", "unchanged")


def render_entries(entries: Sequence[dict]) -> list[str]:
    """Per entry, what the reload does to it: ``llama  apply live  timeout, rate_limit`` or
    ``qwen  new worker  port (also timeout)``; unchanged entries on one line at the end."""
    rows, unchanged = [], []
    for e in sorted(
        entries,
        key=lambda e: (
            _ENTRY_ORDER.index(e.get("kind")) if e.get("kind") in _ENTRY_ORDER else len(_ENTRY_ORDER),
            e.get("name", ""),
        ),
    ):
        kind, keys, forcing = e.get("kind", "?"), list(e.get("keys") or []), list(e.get("forcing") or [])
        if kind == "unchanged":
            unchanged.append(e.get("name", "?"))
            continue
        if kind == "new worker" and forcing:
            rest = [k for k in keys if k not in forcing]
            detail = ", ".join(forcing) + (f" (also {', '.join(rest)})" if rest else "")
        else:
            detail = ", ".join(keys)
        rows.append((e.get("name", "?"), kind, detail))
    lines = render_table(("MODEL", "CHANGE", "KEYS"), rows).splitlines() if rows else []
    if unchanged:
        lines.append(f"unchanged: {', '.join(unchanged)}")
    return lines


def _beside_table(lines: list[str]) -> list[str]:
    """The plan's lines without its ``unchanged:`` line, which the entries' table ends with too."""
    return [line for line in lines if not line.startswith("unchanged: ")]


def render_reload(result: ReloadResponse) -> str:
    """The plan, under a line saying whether it was applied; or the error, FILE:LINE:COL first.

    A daemon that sends ``entries`` (per entry: ``name``, ``kind``, ``keys``, ``forcing``) gets
    them as a table above the rest of its plan text (``no changes`` first); ``config_path`` names the
    file that was read.
    """
    plan = [_INDENT + line for line in result.plan.splitlines()]
    entries = getattr(result, "entries", None)  # an extra field: older daemons do not send it
    if result.ok:
        head = "would apply:" if result.dry_run else "reloaded:"
        path = getattr(result, "config_path", None)
        if path and result.dry_run:
            head = f"would apply {path}:"
        if not entries:
            return "\n".join([head, *plan])
        rest = _beside_table(result.plan.splitlines())
        headline = rest[:1] if rest[:1] == ["no changes"] else []
        lines = headline + render_entries(entries) + rest[len(headline) :]
        return "\n".join([head] + [_INDENT + line for line in lines])
    head = (
        "the reload would fail; nothing changed:"
        if result.dry_run
        else "reload failed; the daemon keeps its previous config:"
    )
    lines = [head, *(result.error or "unknown error").splitlines()]
    if plan:
        lines += ["plan:", *plan]
    return "\n".join(lines)


def render_action(verb: str, result: ActionResponse) -> str:
    """``llama: restarted`` or the daemon's message; ``restart llama failed: ...`` when not ok."""
    if result.ok:
        return f"{result.name}: {result.message or verb + ' ok'}"
    return f"{verb} {result.name} failed: {result.message or 'no reason given'}"


def render_check(path: str, names: Sequence[str], memory: str = "") -> str:
    """``FILE: ok (2 models: a, b)``, then the memory plan's lines."""
    count = f"{len(names)} model{'' if len(names) == 1 else 's'}"
    head = f"{path}: ok ({count}: {', '.join(names)})" if names else f"{path}: ok ({count})"
    return "\n".join([head, *memory.splitlines()])


def render_check_refused(path: str, refusal: str) -> str:
    """``FILE: refused: not enough memory: ...``, the daemon would exit 78 on it."""
    return f"{path}: refused: {refusal}"


__all__ = [
    "MODELS_HEADERS",
    "format_clock",
    "format_duration",
    "format_size",
    "pull_progress",
    "render_models",
    "render_pull_bar",
    "render_pull_end",
    "render_table",
]
