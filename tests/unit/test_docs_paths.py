"""The docs name only what exists, and docs/architecture.md stays a short map.

Read from the docs' text: every path of the repository named in docs/*.md, docs/plans/*.md,
README.md and vllmmlxd/engine/README.md (``vllmmlxd/engine/step/scheduler.py``,
``engine/step/scheduler.py``, ``supervisor/slot/slot.py``, ``tests/unit/...``, ``bench/peers.py``, a
module with a name in it: ``http/ratelimit.GroupQuotas``), every bare module or page name
(``scheduler.py``, ``operations.md``), every dotted module name (``vllmmlxd.engine.step.scheduler``,
``vllmmlxd.worker.follower``) and every relative link with its anchor resolves. A path is resolved
from the repository's root, from ``vllmmlxd/`` (``engine/...``, ``supervisor/...``) or from the doc's
own folder (the engine's README names ``step/scheduler.py``). URLs, absolute paths, ``~/...`` and
other projects' files (``mlx_lm/...``) are not the repository's and are skipped.
"""

from __future__ import annotations

import ast
import os
import re
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "vllmmlxd"
ARCHITECTURE = REPO / "docs" / "architecture.md"
MAX_ARCHITECTURE_LINES = 300
# Folders of the repository a doc names paths under: its own, and the package's.
ROOTS = ("vllmmlxd", "tests", "bench", "docs", "config", "service")
PACKAGES = tuple(sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists()))
FILE_ENDINGS = {"py", "md", "yaml", "yml", "json", "toml", "service", "plist", "sock", "jinja", "txt"}
SKIPPED_FOLDERS = {"__pycache__", ".venv", ".git", ".state", ".clients", "node_modules", "test-artifacts"}


def docs() -> list[Path]:
    found = [*sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "docs" / "plans").glob("*.md"))]
    return [*found, REPO / "README.md", PKG / "engine" / "README.md"]


@cache
def _file_names() -> frozenset[str]:
    """The name of every file of the repository (for bare names: ``scheduler.py``)."""
    names: set[str] = set()
    for _, folders, files in os.walk(REPO):
        folders[:] = [f for f in folders if f not in SKIPPED_FOLDERS and not f.startswith(".")]
        names.update(files)
    return frozenset(names)


@cache
def _defined(module: Path) -> frozenset[str]:
    """The names a module defines anywhere: functions, classes, assigned names and attributes."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):  # a name imported here is one the module offers too
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return frozenset(names)


def _path_exists(base: Path, path: str) -> bool:
    """``path`` under ``base``: a file or folder, a glob that matches, a module without its
    ``.py``, or a module and a name it defines (``http/ratelimit.GroupQuotas``)."""
    if "*" in path:
        return any(base.glob(path))
    if (base / path).exists() or (base / f"{path}.py").exists():
        return True
    stem, dot, name = path.rpartition(".")
    module = base / (stem if stem.endswith(".py") else f"{stem}.py")
    return bool(dot) and "/" not in name and module.is_file() and name in _defined(module)


def _path_pattern(doc: Path) -> re.Pattern[str]:
    """Paths that start with a folder of the repository, of the package, or beside ``doc``."""
    beside = {p.name for p in doc.parent.iterdir() if p.is_dir() and p.name not in SKIPPED_FOLDERS}
    firsts = "|".join(sorted({*ROOTS, *PACKAGES, *beside}, key=len, reverse=True))
    return re.compile(rf"(?<![\w./~:$<-])(?:{firsts})/(?:[\w.*-]+/?)*[\w*/]")


BARE = re.compile(r"(?<![\w./~:$<(*-])[\w-]+\.(?:py|md)\b(?![\w/.-])")
DOTTED = re.compile(r"(?<![\w./-])vllmmlxd(?:\.\w+)+")
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.M)
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


@cache
def anchors(page: Path) -> frozenset[str]:
    """GitHub's anchors for ``page``'s headings (duplicates numbered as GitHub numbers them)."""
    found: list[str] = []
    for title in HEADING.findall(FENCE.sub("", page.read_text())):
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        found.append(slug if slug not in found else f"{slug}-{found.count(slug)}")
    return frozenset(found)


def _module_exists(dotted: str) -> bool:
    """``vllmmlxd.a.b`` is a module or package, or names something its longest module defines."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        where = REPO.joinpath(*parts[:end])
        module = where / "__init__.py" if where.is_dir() else where.with_suffix(".py")
        if module.is_file():
            rest = parts[end:]
            return not rest or rest[0] in _defined(module)
    return False


def references(text: str, doc: Path) -> list[tuple[str, str, bool]]:
    """Each reference in ``text`` (as written in ``doc``): its kind, its text, whether it resolves."""
    found: list[tuple[str, str, bool]] = []
    for match in _path_pattern(doc).finditer(text):
        path = match.group(0)
        if any(part.startswith(".") and part not in (".", "..") for part in path.split("/")):
            continue  # a hidden folder a tool makes (bench/.venv-...): not the repository's
        ok = any(_path_exists(base, path) for base in (REPO, PKG, doc.parent))
        found.append(("path", path, ok))
    for match in BARE.finditer(text):
        found.append(("name", match.group(0), match.group(0) in _file_names()))
    for match in DOTTED.finditer(text):
        dotted = match.group(0)
        if dotted.rpartition(".")[2] not in FILE_ENDINGS:  # vllmmlxd.service, vllmmlxd.example.yaml
            found.append(("module", dotted, _module_exists(dotted)))
    for match in LINK.finditer(text):
        target = match.group(1)
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        page_name, _, anchor = target.partition("#")
        page = (doc.parent / page_name).resolve() if page_name else doc
        ok = page.exists() and (not anchor or page.suffix != ".md" or anchor in anchors(page))
        found.append(("link", target, ok))
    return found


def test_every_path_the_docs_name_exists():
    broken = []
    kinds: dict[str, int] = {}
    for doc in docs():
        assert doc.exists(), f"{doc.relative_to(REPO)} is gone: update docs() here"
        for kind, ref, ok in references(doc.read_text(), doc):
            kinds[kind] = kinds.get(kind, 0) + 1
            if not ok:
                broken.append(f"{doc.relative_to(REPO)}: {kind} {ref}")
    least = {"path": 100, "name": 50, "link": 50, "module": 5}
    assert all(kinds.get(kind, 0) > n for kind, n in least.items()), f"the scan read too few references: {kinds}"
    assert broken == []


def test_the_architecture_doc_is_a_short_map():
    lines = len(ARCHITECTURE.read_text().splitlines())
    assert lines <= MAX_ARCHITECTURE_LINES, (
        f"docs/architecture.md has {lines} lines: keep it a map, put details beside the code or in the topical docs"
    )


def test_the_check_reports_a_wrong_path():
    doc = REPO / "docs" / "architecture.md"
    text = (
        "Good: `engine/step/scheduler.py`, `vllmmlxd/engine/batch/batch.py`, `supervisor/slot/slot.py`, "
        "`http/ratelimit.GroupQuotas`, `tests/unit/engine/test_scheduler*.py`, `bench/peers.py`, "
        "`vllmmlxd.engine.step.scheduler`, `scheduler.py`, [ops](operations.md#reloading), "
        "`mlx_lm/models/cache.py`, http://host/api/chat, `~/.cache/vllmmlxd`.\n"
        "Bad: `engine/replay.py`, `engine/scheduler.py`, `http/ratelimit.NoSuchLimit`, `replay.py`, "
        "`vllmmlxd.engine.replay`, `vllmmlxd.engine.step.scheduler.NoSuchThing`, [gone](gone.md), "
        "[moved](architecture.md#the-engine-that-was-here).\n"
    )
    bad = [ref for _, ref, ok in references(text, doc) if not ok]
    assert bad == [
        "engine/replay.py",
        "engine/scheduler.py",
        "http/ratelimit.NoSuchLimit",
        "replay.py",
        "vllmmlxd.engine.replay",
        "vllmmlxd.engine.step.scheduler.NoSuchThing",
        "gone.md",
        "architecture.md#the-engine-that-was-here",
    ]
