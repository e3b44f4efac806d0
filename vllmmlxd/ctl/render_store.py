"""Text for people about the model store: its table, a pull's progress line and bar, and the
line a pull ends with. Pure functions (``render`` re-exports them)."""

from __future__ import annotations

from vllmmlxd.control.protocol import PullStatus, StoreResponse

from .formats import format_duration, render_table

_PULL_ENDED = ("done", "failed", "cancelled")


def ended(p: PullStatus) -> bool:
    return p.state in _PULL_ENDED


def format_size(n: float | None) -> str:
    """``512 B``, ``12.5 MB``, ``4.27 GB``: decimal units, as the hub shows sizes (as store/disk.py's format_bytes)."""
    if n is None:
        return "?"
    for unit, size in (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}" if n / size < 10 else f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def pull_progress(p: PullStatus) -> str:
    """What a pull is doing, in words: ``37% of 4.27 GB, 12.5 MB/s, 2m48s left``, ``verifying checksums``."""
    if p.state == "queued":
        return "waiting for other pulls to finish"
    if p.state == "resolving":
        return "asking the hub for its files"
    if p.state == "verifying":
        return "verifying checksums"
    if p.state == "installing":
        return "installing into the store"
    if p.state != "downloading":
        return p.state
    parts = [f"{p.percent:g}% of {format_size(p.total_bytes)}" if p.percent is not None else "starting"]
    if p.bytes_per_s:
        parts.append(f"{format_size(p.bytes_per_s)}/s")
    if p.eta_s is not None:
        parts.append(f"{format_duration(p.eta_s)} left")
    return ", ".join(parts)


def render_pull_bar(p: PullStatus, width: int = 80) -> str:
    """One terminal line, redrawn in place: ``org/name  [#######-------]  37%  1.58 GB/4.27 GB  12.5 MB/s  2m48s``."""
    if p.state != "downloading" or p.percent is None:
        return f"{p.repo}  {pull_progress(p)}"[:width]
    figures = f"{p.percent:5.1f}%  {format_size(p.done_bytes)}/{format_size(p.total_bytes)}"
    if p.bytes_per_s:
        figures += f"  {format_size(p.bytes_per_s)}/s"
    if p.eta_s is not None:
        figures += f"  ETA {format_duration(p.eta_s)}"
    room = width - len(p.repo) - len(figures) - 6  # "  [", "]  "
    if room < 10:
        return f"{p.repo}  {figures}"[:width]
    filled = int(room * p.percent / 100)
    return f"{p.repo}  [{'#' * filled}{'-' * (room - filled)}]  {figures}"


def render_pull_end(p: PullStatus, seconds: float | None = None) -> str:
    """The line a pull ends with: where it went and how to use it, or why it did not."""
    commit = f" @ {p.commit[:12]}" if p.commit else ""
    at = f" ({p.revision}){commit}" if p.revision else commit
    if p.state == "done" and p.already:
        return f"{p.repo}{at} is already in the store: {p.path}"
    if p.state == "done":
        took = f" in {format_duration(seconds)}" if seconds is not None else ""
        return (
            f"pulled {p.repo}{at}: {format_size(p.total_bytes)}{took}, into {p.path}\n"
            f"serve it with `model: {p.repo}` in an entry, then `vllmmlxctl reload`"
        )
    if p.state == "cancelled":
        return f"the pull of {p.repo} was cancelled; the files it finished stay: `vllmmlxctl pull {p.repo}` resumes it"
    return f"pull {p.repo} failed: {p.error or 'no reason given'}"


MODELS_HEADERS = ("NAME", "KIND", "SIZE", "USED BY", "SOURCE")


def render_models(store: StoreResponse) -> str:
    """The store's table (name, kind, size, the entries that use it, where it came from), then its
    folder with the total and the free space, and the pulls under way."""
    rows = [
        (m.name, m.kind, format_size(m.size_bytes), ",".join(m.used_by) or "-", m.source or "-") for m in store.models
    ]
    lines = [render_table(MODELS_HEADERS, rows)] if rows else ["no models in the store"]
    total = sum(m.size_bytes for m in store.models)
    free = f", {format_size(store.free_bytes)} free" if store.free_bytes is not None else ""
    lines += ["", f"store: {store.path} ({format_size(total)} in {len(store.models)}{free})"]
    lines += [f"pulling {p.repo}: {pull_progress(p)}" for p in store.pulls if not ended(p)]
    return "\n".join(lines)
