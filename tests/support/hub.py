"""A stand-in for the Hugging Face hub on 127.0.0.1, for pulls without the internet.

It speaks what huggingface_hub's downloads read (its installed source is the reference), so the
real ``snapshot_download``, ``hf_hub_download`` and ``verify_repo_checksums`` run against it with
``HF_ENDPOINT=hub.url``:

- ``GET /api/models/ORG/NAME[/revision/REV]``: the repo's info (``sha``: the commit, ``siblings``);
- ``GET /api/models/ORG/NAME/tree/REV?recursive=...``: each file's size, git blob id, and for LFS
  files (``*.safetensors``) their sha256 and size (``lfs``);
- ``HEAD``/``GET /ORG/NAME/resolve/REV/PATH``: ``X-Repo-Commit``, ``ETag`` (an LFS file's sha256,
  else its git blob id), ``Content-Length``, and ``Range: bytes=N-`` answered 206.

An unknown repo or revision is a 404 with the hub's ``X-Error-Code``. Faults a test can set, per file:
``drop_after`` (cut the connection after that many bytes of the body, ``drops`` times), ``corrupt``
(serve other bytes of the same size than the listing's checksums describe), ``claimed_size`` (the
listing claims that size: disk admission), ``rate`` (bytes per second); and ``refuse_key`` (a 403
quoting the request's token back). It counts what it served.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

CHUNK = 64 * 1024


def git_blob_id(data: bytes) -> str:
    """The git hash of a file, as the hub's listing gives it for a file kept in git."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class StandInRepo:
    files: dict[str, bytes]
    commit: str
    lfs: frozenset[str]

    def etag(self, path: str) -> str:
        data = self.files[path]
        return hashlib.sha256(data).hexdigest() if path in self.lfs else git_blob_id(data)


@dataclass
class Faults:
    drop_after: dict[str, int] = field(default_factory=dict)
    drops: int = 1  # how many GETs of that file are cut
    corrupt: set[str] = field(default_factory=set)
    claimed_size: dict[str, int] = field(default_factory=dict)
    rate: dict[str, float] = field(default_factory=dict)
    refuse_key: bool = False  # answer 403 to the repo's info, quoting the Authorization header back


class StandInHub:
    """The stand-in hub (see the module); ``with StandInHub() as hub:`` serves until the block ends."""

    def __init__(self) -> None:
        self.repos: dict[str, StandInRepo] = {}
        self.faults = Faults()
        self.served: Counter[str] = Counter()  # body bytes sent per file path
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range header)
        self._drops_done: Counter[str] = Counter()
        self._epoch = 0  # bumped by reset_counts: a slow answer begun before it is not counted after it
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def add(self, repo: str, files: dict[str, bytes], lfs=lambda path: path.endswith(".safetensors")) -> str:
        """Serve ``files`` as ``repo``'s main branch; its commit id."""
        digest = hashlib.sha1(json.dumps({p: hashlib.sha256(d).hexdigest() for p, d in sorted(files.items())}).encode())
        commit = digest.hexdigest()
        self.repos[repo] = StandInRepo(dict(files), commit, frozenset(p for p in files if lfs(p)))
        return commit

    def add_folder(self, repo: str, folder: Path) -> str:
        """Serve a model folder's files (its dot-files left out) as ``repo``."""
        files = {
            p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*"))
            if p.is_file() and not p.name.startswith(".")
        }
        return self.add(repo, files)

    def reset_counts(self) -> None:
        with self._lock:
            self.served.clear()
            self.requests.clear()
            self._epoch += 1

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> StandInHub:
        hub = self

        class Handler(_Handler):
            stand_in = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True, name="stand-in-hub").start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # -- what the handler asks -------------------------------------------------------------------

    def take_drop(self, path: str) -> int | None:
        """The byte count after which this GET of ``path`` is cut, if it is one of those to cut."""
        with self._lock:
            if path not in self.faults.drop_after or self._drops_done[path] >= self.faults.drops:
                return None
            self._drops_done[path] += 1
            return self.faults.drop_after[path]

    def record(self, method: str, path: str, range_header: str | None) -> None:
        with self._lock:
            self.requests.append((method, path, range_header))

    def count(self, path: str, n: int, epoch: int) -> None:
        with self._lock:
            if epoch == self._epoch:
                self.served[path] += n


_API = re.compile(r"^/api/models/([^/]+/[^/]+)(?:/(revision|tree)/([^/]+)(?:/.*)?)?$")
_RESOLVE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as huggingface_hub's pooled client expects
    stand_in: StandInHub

    def log_message(self, format: str, *args: object) -> None:  # quiet: pytest shows what fails
        pass

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        hub = self.stand_in
        hub.record(self.command, path, self.headers.get("Range"))
        if m := _API.match(path):
            repo, what, rev = m[1], m[2], m[3]
            if hub.faults.refuse_key:  # a server that echoes what it was sent: the client must not repeat it
                return self._error(403, "Forbidden", f"key refused: {self.headers.get('Authorization')}")
            found = self._repo(repo, rev)
            if found is None:
                return
            if what == "tree":
                return self._json(200, [self._entry(found, p) for p in sorted(found.files)], body)
            siblings = [{"rfilename": p} for p in sorted(found.files)]
            return self._json(200, {"id": repo, "modelId": repo, "sha": found.commit, "siblings": siblings}, body)
        if m := _RESOLVE.match(path):
            found = self._repo(m[1], m[2])
            if found is None:
                return
            if m[3] not in found.files:
                return self._error(404, "EntryNotFound", f"{m[3]} not in {m[1]}", found.commit)
            return self._file(found, m[3], body)
        self._error(404, "RepoNotFound", f"no route {path}")

    def _repo(self, repo: str, rev: str | None) -> StandInRepo | None:
        found = self.stand_in.repos.get(repo)
        if found is None:
            self._error(404, "RepoNotFound", f"Repository Not Found for url: {self.path}")
            return None
        if rev not in (None, "main", found.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return found

    def _entry(self, repo: StandInRepo, path: str) -> dict:
        data = repo.files[path]
        size = self.stand_in.faults.claimed_size.get(path, len(data))
        entry = {"type": "file", "oid": git_blob_id(data), "size": size, "path": path}
        if path in repo.lfs:
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
        return entry

    def _file(self, repo: StandInRepo, path: str, body: bool) -> None:
        hub, data = self.stand_in, repo.files[path]
        if path in hub.faults.corrupt:
            data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]  # same size, other bytes
        start, status = 0, 200
        wanted = self.headers.get("Range")
        if m := re.match(r"bytes=(\d+)-", wanted or ""):
            start, status = min(int(m[1]), len(data)), 206
        part = data[start:]
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{repo.etag(path)}"')
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(hub.faults.claimed_size.get(path, len(part))))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not body:
            return
        cut = hub.take_drop(path)
        rate = hub.faults.rate.get(path)
        epoch = hub.epoch
        sent = 0
        while sent < len(part):
            n = min(CHUNK, len(part) - sent, cut - sent if cut is not None else CHUNK)
            try:
                self.wfile.write(part[sent : sent + n])
            except OSError:
                return  # the client went away (a cancelled pull)
            sent += n
            hub.count(path, n, epoch)
            if cut is not None and sent >= cut:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)  # mid-body: the client sees a cut connection
                self.close_connection = True
                return
            if rate:
                time.sleep(n / rate)

    def _json(self, status: int, value: object, body: bool) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
        data = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        if commit:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
