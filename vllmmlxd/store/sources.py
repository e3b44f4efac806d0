"""What ``vllmmlxctl pull`` accepts: a repo id (``org/name``) or a hub page's URL, and a revision. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from vllmmlxd.config.names import REPO_ID_RE, hub_repo_id
from vllmmlxd.errors import StoreError

HUB_HOSTS = frozenset({"huggingface.co", "www.huggingface.co", "hf.co"})
# A branch, tag or commit: what the hub's URLs carry after /tree/ (branches may hold '/': refs/pr/1).
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-/]{0,199}$")
_PAGES = ("tree", "blob", "resolve", "commit", "commits", "discussions", "files")
EXPECTED = "a Hugging Face model repo id (org/name) or its page's URL (https://huggingface.co/org/name)"


@dataclass(frozen=True)
class Source:
    """A model on the hub: its repo id, and the revision asked for (None: the repo's default branch)."""

    repo: str
    revision: str | None = None

    def render(self) -> str:
        """``org/name``, or ``org/name@rev`` for a revision asked for."""
        return self.repo if self.revision is None else f"{self.repo}@{self.revision}"


def parse_source(text: str, revision: str | None = None, endpoint: str | None = None) -> Source:
    """Read ``text`` (a repo id, or a URL on the hub or on ``endpoint``, $HF_ENDPOINT) and ``revision``
    (``--revision``) into a ``Source``; ``StoreError`` saying what is accepted otherwise."""
    text = text.strip()
    if revision is not None and not REVISION_RE.match(revision):
        raise StoreError(f"revision {revision!r} is not a branch, tag or commit name")
    repo, from_url = _repo_and_revision(text, endpoint)
    if from_url is not None and revision is not None and from_url != revision:
        raise StoreError(f"the URL names revision {from_url!r} and --revision {revision!r}: give one of the two")
    return Source(repo, revision if revision is not None else from_url)


def _repo_and_revision(text: str, endpoint: str | None) -> tuple[str, str | None]:
    if hub_repo_id(text) is not None:
        return text, None
    if "://" not in text and text.split("/", 1)[0].lower() in HUB_HOSTS:
        text = "https://" + text  # huggingface.co/org/name, as copied without its scheme
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise StoreError(f"{text!r} is not {EXPECTED}")
    hosts = HUB_HOSTS | ({urlsplit(endpoint).hostname or ""} if endpoint else set())
    if parts.hostname.lower() not in hosts:
        raise StoreError(f"{parts.hostname} is not the Hugging Face hub; give {EXPECTED}")
    path = [p for p in parts.path.split("/") if p]
    if path and path[0] in ("datasets", "spaces"):
        raise StoreError(f"{text} is a {path[0][:-1]}, not a model")
    if path and path[0] == "models":
        path = path[1:]
    if len(path) < 2:
        raise StoreError(f"{text} names no model: expected {EXPECTED}")
    repo = f"{path[0]}/{path[1].removesuffix('.git')}"
    if not REPO_ID_RE.match(repo) or hub_repo_id(repo) is None:
        raise StoreError(f"{repo!r} is not a valid repo id (org/name: letters, digits, '-', '_' and '.')")
    rest = path[2:]
    if rest and rest[0] in ("tree", "blob", "resolve") and len(rest) > 1:
        # /tree/REV, /blob/REV/file, /resolve/REV/file: the revision is one segment (a branch with '/'
        # is written URL-quoted there), whatever file follows.
        rev = unquote(rest[1])
        if not REVISION_RE.match(rev):
            raise StoreError(f"revision {rev!r} in {text} is not a branch, tag or commit name")
        return repo, rev
    if rest and rest[0] not in _PAGES:
        raise StoreError(f"{text} names no model: expected {EXPECTED}")
    return repo, None
