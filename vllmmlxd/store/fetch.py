"""One pull, as its own process: ``python -m vllmmlxd.store.fetch --state-dir DIR --repo ORG/NAME``.

The daemon runs it (``pulls.py``) and never imports it: huggingface_hub stays out of the daemon,
and cancelling a pull is ending a process. It writes one JSON object per line on stdout, each
with an ``event``:

- ``resolving``: asking the hub which commit the revision is;
- ``listed``: ``commit``, ``files``, ``total`` bytes, ``have`` (finished by an earlier pull);
  with ``--reserved -`` it then reads one line on stdin, ``{"reserved": BYTES}``: what the
  daemon's other admitted pulls still have to write, as the daemon knows it at that moment;
- ``admitted``: it fits the disk, the download starts;
- ``progress``: ``done`` bytes (at most four a second);
- ``verifying``, then ``installing``;
- ``done``: ``path`` (the store's folder), ``total``, ``already`` (that commit was there);
- ``failed``: ``error`` (never a token), ``refused`` when it was refused before downloading, and
  ``missing`` when the hub has no such repo or revision.

The steps: the hub's listing (files, sizes, checksums) of the revision's commit; refusal of a repo
that is no MLX folder, and disk admission (``disk.py``); ``snapshot_download`` into the pull's own
folder under the downloads dir (files finished by an interrupted pull are kept, and a connection cut
mid-file is resumed from where it stopped, by huggingface_hub); ``verify_repo_checksums`` (sha256
of every LFS file, the git hash of the rest); then one rename into the store.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from vllmmlxd.errors import StoreError
from vllmmlxd.paths import models_dir

from .disk import DiskNeed, refusal
from .layout import MARKER, folder_name, read_marker, store_copy, work_folder

# What mlx-lm and mlx-vlm read from a model folder; READMEs, images and other frameworks'
# weights (*.bin, *.pth, *.gguf, onnx/) stay on the hub.
ALLOW_PATTERNS = [
    "*.json",
    "*.safetensors",
    "*.py",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "*.jsonl",
    "*.jinja",
]
PROGRESS_EVERY_S = 0.25
# The bar huggingface_hub's snapshot_download moves by the bytes written to disk, all files together.
BYTES_BAR = "huggingface_hub.snapshot_download"
EXIT_FAILED, EXIT_REFUSED = 1, 2


class Refused(StoreError):
    """Refused before anything was downloaded (no MLX folder, not enough disk)."""


Emit = Callable[..., None]


def emitter(out: TextIO = sys.stdout) -> Emit:
    """One JSON line per event, whole lines only (the progress thread writes too), each with ``t``:
    seconds since the pull began, when it happened (the reader may read lines late, and bunched)."""
    lock = threading.Lock()
    began = time.monotonic()

    def emit(event: str, **fields: Any) -> None:
        with lock:
            out.write(json.dumps({"event": event, "t": round(time.monotonic() - began, 4), **fields}) + "\n")
            out.flush()

    return emit


class Counter:
    """Bytes written by the download threads (thread-safe), started at what an earlier pull left."""

    def __init__(self, start: int = 0):
        self.value = start
        self._lock = threading.Lock()

    def add(self, n: float | None) -> None:
        with self._lock:
            self.value += int(n or 0)


def counting_bar(counter: Counter) -> type:
    """A huggingface_hub progress bar class that adds the snapshot's written bytes to ``counter``
    (the bars themselves stay as huggingface_hub configures them: off when not on a terminal)."""
    from huggingface_hub.utils import tqdm as hf_tqdm

    class CountingBar(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any):
            self._counts = kwargs.get("name") == BYTES_BAR
            super().__init__(*args, **kwargs)

        def update(self, n: float | None = 1) -> bool | None:
            if self._counts:
                counter.add(n)
            return super().update(n)

    return CountingBar


def report_progress(counter: Counter, emit: Emit, stop: threading.Event) -> None:
    """Emit ``progress`` whenever the counter moved, at most every PROGRESS_EVERY_S, until ``stop``."""
    last = -1
    while not stop.wait(PROGRESS_EVERY_S):
        if counter.value != last:
            last = counter.value
            emit("progress", done=last)


def pull(repo: str, revision: str | None, state_dir: Path, emit: Emit, reserved: int | Callable[[], int] = 0) -> Path:
    """Download ``repo`` at ``revision`` into the store; the store's folder. ``reserved``: bytes other
    running pulls still have to write (disk admission counts them as taken), or how to ask for them
    once this pull's own size is known."""
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import filter_repo_objects

    api = HfApi()
    emit("resolving")
    commit = api.model_info(repo, revision=revision).sha
    if not commit:
        raise StoreError(f"the hub did not say which commit {repo} is at")
    installed = store_copy(repo, state_dir)
    if installed is not None and read_marker(installed).get("commit") == commit:
        emit("done", path=str(installed), total=folder_bytes(installed), already=True)
        return installed
    listing = [f for f in api.list_repo_tree(repo, revision=commit, recursive=True) if isinstance(f, RepoFile)]
    wanted = set(filter_repo_objects([f.path for f in listing], allow_patterns=ALLOW_PATTERNS))
    files = {f.path: f for f in listing if f.path in wanted}
    not_mlx_folder(repo, files, [f.path for f in listing])
    work = work_folder(repo, state_dir)
    work.mkdir(parents=True, exist_ok=True)
    remove_leftovers(work)
    finished = {p for p, f in files.items() if _size(work / p) == f.size}
    have = sum(files[p].size for p in finished)
    total = sum(f.size for f in files.values())
    emit("listed", commit=commit, files=len(files), total=total, have=have)
    others = reserved() if callable(reserved) else reserved
    admit(repo, work, models_dir(state_dir), total, have, (len(files) - len(finished), len(files)), others)
    emit("admitted")

    counter = Counter(have)
    stop = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(counter, emit, stop), daemon=True)
    reporter.start()
    try:
        snapshot_download(
            repo,
            revision=commit,
            local_dir=work,
            allow_patterns=ALLOW_PATTERNS,
            tqdm_class=counting_bar(counter),
            max_workers=4,
        )
    finally:
        stop.set()
        reporter.join()
    emit("progress", done=counter.value)
    emit("verifying")
    check(api, repo, commit, work, files)
    emit("installing")
    marker = {
        "pulled": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "repo": repo,
        "revision": revision,
        "commit": commit,
        "files": len(files),
        "bytes": total,
    }
    path = install(work, folder_name(repo), marker, models_dir(state_dir))
    emit("done", path=str(path), total=total, already=False)
    return path


def not_mlx_folder(repo: str, files: dict, listed: list[str]) -> None:
    """Refuse a repo that no loader here can serve, before anything is downloaded (``files``: those
    it would download, ``listed``: all the repo's)."""
    if "config.json" in files and any(p.endswith(".safetensors") for p in files):
        return
    hint = (
        " (it holds GGUF files: download the .gguf and give its path as model)"
        if any(p.endswith(".gguf") for p in listed)
        else ""
    )
    raise Refused(
        f"{repo} is not an MLX model folder: it has no config.json with *.safetensors beside it{hint}; "
        "MLX conversions are usually under mlx-community/"
    )


def admit(repo: str, work: Path, store: Path, total: int, have: int, files: tuple[int, int], reserved: int) -> None:
    """Refuse, with the numbers, a pull whose files do not fit the disk (``disk.refusal``); ``files``:
    how many are still to download, of how many."""
    need = DiskNeed(total - have, files[0], have, shutil.disk_usage(work).free, str(work.parent), reserved)
    why = refusal(repo, need)
    if why:
        raise Refused(why)
    store.mkdir(parents=True, exist_ok=True)
    if os.stat(store).st_dev != os.stat(work).st_dev:  # the install is then a copy: the store needs it all
        why = refusal(repo, DiskNeed(total, files[1], 0, shutil.disk_usage(store).free, str(store), reserved))
        if why:
            raise Refused(why)


def check(api: Any, repo: str, commit: str, work: Path, files: dict) -> None:
    """Every file against the hub's checksums; a file that differs is deleted (a pull fetches it anew)."""
    result = api.verify_repo_checksums(repo, revision=commit, local_dir=work)
    bad = [m for m in result.mismatches if m["path"] in files]
    missing = [p for p in result.missing_paths if p in files]
    for m in bad:
        forget(work, m["path"])
    if bad:
        first = bad[0]
        more = f" (and {len(bad) - 1} more file{'s' if len(bad) > 2 else ''})" if len(bad) > 1 else ""
        raise StoreError(
            f"checksum mismatch in {repo}: {first['path']} has {first['algorithm']} {first['actual'][:16]}…, "
            f"the hub lists {first['expected'][:16]}…{more}; deleted it and installed nothing: pull again to fetch it anew"
        )
    if missing:
        raise StoreError(f"{repo}: {', '.join(missing[:3])} missing after the download; installed nothing: pull again")


def forget(work: Path, path: str) -> None:
    """Delete a downloaded file and huggingface_hub's record of it, so that the next pull fetches it."""
    (work / path).unlink(missing_ok=True)
    (work / ".cache" / "huggingface" / "download" / (path + ".metadata")).unlink(missing_ok=True)


def remove_leftovers(work: Path) -> None:
    """Drop parts of files a killed pull was writing: huggingface_hub names them per download, so none
    is ever resumed, and each may be gigabytes."""
    for part in (work / ".cache").rglob("*.incomplete"):
        part.unlink(missing_ok=True)


def install(work: Path, folder: str, marker: dict, store: Path) -> Path:
    """Move the checked ``work`` folder into ``store`` as ``folder`` in one rename (an older copy is
    replaced whole; a running worker keeps the files it opened). The marker is written last."""
    shutil.rmtree(work / ".cache", ignore_errors=True)  # huggingface_hub's bookkeeping, not the model's
    (work / MARKER).write_text(json.dumps(marker), encoding="utf-8")
    store.mkdir(parents=True, exist_ok=True)
    target = store / folder
    staged = store / f".tmp-{folder}-{os.getpid()}-{time.monotonic_ns()}"
    try:
        os.rename(work, staged)
    except OSError:  # another filesystem: copy, then drop the download
        shutil.copytree(work, staged)
        shutil.rmtree(work, ignore_errors=True)
    old = store / f".tmp-old-{folder}-{os.getpid()}-{time.monotonic_ns()}"
    if target.exists():
        os.rename(target, old)
    os.rename(staged, target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def folder_bytes(folder: Path) -> int:
    """The size of a folder's files."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def describe(exc: BaseException, repo: str, revision: str | None) -> str:
    """A failure in words for the person who asked for the pull (huggingface_hub's own messages run
    several lines, with request ids): what happened and what to do."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = constants.ENDPOINT
    if isinstance(exc, StoreError):
        return str(exc)
    if isinstance(exc, GatedRepoError):
        return f"{repo} is gated: accept its terms on the hub, then set HF_TOKEN (for the daemon) to a token of yours"
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo} has no revision {revision!r}"
    if isinstance(exc, RepositoryNotFoundError):
        return f"no model {repo} on {endpoint} (a private one needs HF_TOKEN set for the daemon)"
    if isinstance(exc, OfflineModeIsEnabled) or constants.HF_HUB_OFFLINE:
        return "the daemon runs with HF_HUB_OFFLINE set: unset it to pull"
    if isinstance(exc, LocalEntryNotFoundError) or type(exc).__module__.startswith(("httpx", "httpcore")):
        return f"cannot reach {endpoint}: {_first_line(exc)}"  # its HTTP client's own errors: no network
    if isinstance(exc, HfHubHTTPError):
        return f"{endpoint} answered: {_first_line(exc)}"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return f"{type(exc).__name__}: {_first_line(exc)}"


def names_nothing(exc: BaseException) -> bool:
    """Did the hub say that the repo or revision asked for does not exist (not gated, not unreachable)?"""
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    # A gated repo exists (GatedRepoError is a RepositoryNotFoundError): it needs a token, not another name.
    return isinstance(exc, (RepositoryNotFoundError, RevisionNotFoundError)) and not isinstance(exc, GatedRepoError)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def redact(text: str, secrets: list[str | None]) -> str:
    """``text`` with every secret in it (the hub token) replaced."""
    for secret in secrets:
        if secret and len(secret) >= 8:
            text = text.replace(secret, "<token>")
    return text


def main(argv: list[str] | None = None) -> int:
    """Run one pull (see the module); exits 0 once installed, 2 refused, 1 failed."""
    parser = argparse.ArgumentParser(prog="python -m vllmmlxd.store.fetch")
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--repo", required=True)
    parser.add_argument("--revision")
    parser.add_argument(
        "--reserved",
        default="0",
        help="bytes other running pulls still have to write; '-': ask the daemon on stdin once listed",
    )
    args = parser.parse_args(argv)
    emit = emitter()
    try:
        reserved = _ask_reserved if args.reserved == "-" else int(args.reserved)
        pull(args.repo, args.revision, Path(args.state_dir), emit, reserved)
        return 0
    except Exception as exc:  # every failure is one line for the daemon, never a traceback
        from huggingface_hub import get_token

        message = redact(describe(exc, args.repo, args.revision), [get_token(), os.environ.get("HF_TOKEN")])
        emit("failed", error=message, refused=isinstance(exc, Refused), missing=names_nothing(exc))
        return EXIT_REFUSED if isinstance(exc, Refused) else EXIT_FAILED


def _ask_reserved() -> int:
    """The daemon's answer to ``listed``: what its other admitted pulls still have to write."""
    line = sys.stdin.readline()
    try:
        return max(int(json.loads(line)["reserved"]), 0)
    except (ValueError, KeyError, TypeError):
        raise StoreError("the daemon did not say what other pulls have reserved") from None


if __name__ == "__main__":
    sys.exit(main())
