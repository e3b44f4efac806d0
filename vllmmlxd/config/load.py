"""Load a config file into a validated ``Config``.

YAML is composed (not just parsed) so every node keeps its line and column; each
problem, from YAML syntax to a pydantic error, is reported as ``FILE:LINE:COL:
dotted.path: message``. Whole-string values ``${env:NAME}`` and ``${file:/path}``
are replaced with secrets, and no secret's value is ever written into an error.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import re
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails
from yaml.nodes import CollectionNode, MappingNode, Node, ScalarNode, SequenceNode

from vllmmlxd.config.entries import ENTRY_KINDS
from vllmmlxd.config.schema import INTERNAL_FIELDS, Config
from vllmmlxd.errors import ConfigError

Loc = tuple[str | int, ...]

_SUBSTITUTION = re.compile(r"\$\{(?P<kind>[A-Za-z_]+):(?P<arg>[^}]*)\}")
_MERGE_TAG = "tag:yaml.org,2002:merge"
# Paths people write with ~; expanded before validation so Path fields hold real paths.
_EXPANDED_PATHS = ("state_dir", "control_socket")


@dataclass(frozen=True)
class LoadedConfig:
    """A validated config and where it came from."""

    config: Config
    path: str
    text_hash: str  # sha256 hex of the file's bytes: tells a reload whether the file changed

    @property
    def short_hash(self) -> str:
        """The first 12 hex digits of ``text_hash``, for logs and ``vllmmlxctl``."""
        return self.text_hash[:12]


@dataclass(frozen=True)
class _Pos:
    line: int  # 1-based
    column: int  # 1-based

    def __str__(self) -> str:
        return f"{self.line}:{self.column}"


@dataclass(frozen=True)
class _Marks:
    key: _Pos
    value: _Pos
    is_container: bool


def load_config(path: str | os.PathLike[str]) -> LoadedConfig:
    """Read, parse, substitute and validate the config file at ``path``; raise ``ConfigError``."""
    name = os.fspath(path)
    try:
        data = Path(name).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{name}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{name}: cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{name}: not UTF-8 text (bad byte at offset {e.start})") from None
    return _parse(text, name, hashlib.sha256(data).hexdigest())


def parse_config(text: str, path: str = "<string>") -> LoadedConfig:
    """Parse config ``text`` as if read from ``path`` (used in messages and for relative ``${file:..}``)."""
    return _parse(text, path, hashlib.sha256(text.encode("utf-8")).hexdigest())


def _parse(text: str, path: str, text_hash: str) -> LoadedConfig:
    reader = _Reader(path)
    data = reader.read(text)
    try:
        config = Config.model_validate(data)
    except ValidationError as e:
        # `from None`: the ValidationError's own text shows input values, secrets included.
        lines = [reader.describe(err) for err in e.errors(include_url=False)]
        raise ConfigError("\n".join(sorted(lines, key=_position))) from None
    return LoadedConfig(config=config, path=path, text_hash=text_hash)


def _pos(node: Node) -> _Pos:
    return _Pos(node.start_mark.line + 1, node.start_mark.column + 1)


def _dotted(loc: Loc) -> str:
    """``("models", "llama", "aliases", 0)`` -> ``models.llama.aliases[0]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


class _Reader:
    """Turns YAML text into plain Python, remembering where each key path was written."""

    def __init__(self, path: str):
        self.path = path
        self.base_dir = Path(path).parent  # relative ${file:..} paths are relative to the config file
        self.marks: dict[Loc, _Marks] = {}
        self.root = _Pos(1, 1)
        self.errors: list[str] = []
        self._active: set[int] = set()

    def read(self, text: str) -> dict:
        loader = yaml.SafeLoader(text)
        try:
            node = loader.get_single_node()
            data = {} if node is None else self._top(loader, node)
        except yaml.MarkedYAMLError as e:
            raise ConfigError(self._yaml_message(e)) from None
        except yaml.YAMLError as e:
            raise ConfigError(f"{self.path}: invalid YAML: {str(e).splitlines()[0]}") from None
        finally:
            loader.dispose()
        if self.errors:
            raise ConfigError("\n".join(self.errors))
        return data

    def _top(self, loader: yaml.SafeLoader, node: Node) -> dict:
        self.root = _pos(node)
        if not isinstance(node, MappingNode):
            raise ConfigError(f"{self.path}:{self.root}: the top level must be a mapping of 'daemon' and 'models'")
        data = self._to_python(loader, node, ())
        # A section whose entries are all commented out reads as null: treat it as absent.
        data = {k: v for k, v in data.items() if not (k in ("daemon", "models") and v is None)}
        daemon = data.get("daemon")
        if isinstance(daemon, dict):
            for key in _EXPANDED_PATHS:
                if isinstance(daemon.get(key), str):
                    daemon[key] = os.path.expanduser(daemon[key])
        # mcpServers files, like ${file:..}, are found relative to the config file.
        if isinstance(data.get("mcp_config"), str):
            data["mcp_config"] = self._near(data["mcp_config"])
        for entry in data["models"].values() if isinstance(data.get("models"), dict) else ():
            if isinstance(entry, dict) and isinstance(entry.get("mcp_config"), str):
                entry["mcp_config"] = self._near(entry["mcp_config"])
        return data

    def _near(self, path: str) -> str:
        p = Path(path).expanduser()
        return str(p if p.is_absolute() else self.base_dir / p)

    def _to_python(self, loader: yaml.SafeLoader, node: Node, loc: Loc) -> Any:
        if id(node) in self._active:
            raise ConfigError(f"{self.path}:{_pos(node)}: {_dotted(loc)}: an alias refers to itself")
        self._active.add(id(node))
        try:
            if isinstance(node, MappingNode):
                return self._mapping(loader, node, loc)
            if isinstance(node, SequenceNode):
                out = []
                for i, child in enumerate(node.value):
                    self.marks[(*loc, i)] = _Marks(_pos(child), _pos(child), isinstance(child, CollectionNode))
                    out.append(self._to_python(loader, child, (*loc, i)))
                return out
            value = loader.construct_object(node, deep=True)
            if isinstance(value, str) and (m := _SUBSTITUTION.fullmatch(value)):
                return self._substitute(m["kind"], m["arg"], node, loc)
            if isinstance(value, str) and loc[:1] == ("mcp_servers",) and _SUBSTITUTION.search(value):
                # MCP headers carry a secret inside text ("Bearer ${env:TOKEN}"): substituted in place there.
                return _SUBSTITUTION.sub(lambda m: self._substitute(m["kind"], m["arg"], node, loc) or "", value)
            return value
        finally:
            self._active.discard(id(node))

    def _mapping(self, loader: yaml.SafeLoader, node: MappingNode, loc: Loc) -> dict:
        first: dict[str, _Pos] = {}
        for key, _ in node.value:
            if key.tag == _MERGE_TAG or not isinstance(key, ScalarNode):
                continue
            if key.value in first:
                at = first[key.value]
                self.errors.append(
                    f"{self.path}:{_pos(key)}: {_dotted((*loc, key.value))}: duplicate key, "
                    f"first defined at line {at.line}, column {at.column}"
                )
            else:
                first[key.value] = _pos(key)
        loader.flatten_mapping(node)  # resolves `<<: *anchor` merges; explicit keys come last and win
        out: dict[str, object] = {}
        for key, value in node.value:
            if not isinstance(key, ScalarNode):
                self.errors.append(
                    f"{self.path}:{_pos(key)}: {_dotted(loc) or 'top level'}: keys must be plain strings"
                )
                continue
            # Keys stay the text as written, so a model named `8001` or `yes` is the string it looks like.
            child = (*loc, key.value)
            self.marks[child] = _Marks(_pos(key), _pos(value), isinstance(value, CollectionNode))
            out[key.value] = self._to_python(loader, value, child)
        return out

    def _substitute(self, kind: str, arg: str, node: Node, loc: Loc) -> str | None:
        where = f"{self.path}:{_pos(node)}: {_dotted(loc)}"
        if kind == "env":
            value = os.environ.get(arg) if arg else None
            if value is None:
                self.errors.append(f"{where}: environment variable {arg or '(empty name)'} is not set")
            return value
        if kind == "file":
            p = Path(arg).expanduser()
            p = p if p.is_absolute() else self.base_dir / p
            try:
                text = p.read_text(encoding="utf-8")
            except OSError as e:
                self.errors.append(f"{where}: cannot read secret file {p}: {e.strerror or type(e).__name__}")
                return None
            except UnicodeDecodeError:
                self.errors.append(f"{where}: secret file {p} is not UTF-8 text")
                return None
            return text.removesuffix("\n")  # `echo secret > file` adds one newline that is not part of it
        self.errors.append(f"{where}: unknown substitution '${{{kind}:...}}'; use ${{env:NAME}} or ${{file:/path}}")
        return None

    def _yaml_message(self, e: yaml.MarkedYAMLError) -> str:
        mark = e.problem_mark or e.context_mark
        where = f"{self.path}:{mark.line + 1}:{mark.column + 1}" if mark else self.path
        problem = e.problem or e.context or "syntax error"
        if not (e.problem and e.context):
            return f"{where}: invalid YAML: {problem}"
        context = f"{e.context} at line {e.context_mark.line + 1}" if e.context_mark else e.context
        # PyYAML phrases some problems as the second half of a sentence ("..., but found ...").
        if problem.startswith("but "):
            return f"{where}: invalid YAML: {context}, {problem}"
        return f"{where}: invalid YAML: {problem} ({context})"

    def describe(self, err: ErrorDetails) -> str:
        """One pydantic error as ``FILE:LINE:COL: path: message``, without its input value."""
        raw: Loc = tuple(part for part in err["loc"] if part != "[key]")
        loc: Loc = tuple(part for part in raw if part not in ENTRY_KINDS)  # which kind of entry: not a key
        found = next((loc[:i] for i in range(len(loc), 0, -1) if loc[:i] in self.marks), ())
        marks = self.marks.get(found, _Marks(self.root, self.root, True))
        message = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            return f"{self.path}:{marks.key}: {_dotted(loc)}: {_unknown_key(raw)}"
        if found == loc and not marks.is_container:
            return f"{self.path}:{marks.value}: {_dotted(loc)}: {message}"
        if found == loc:
            # A validator over a whole mapping names the entry at fault ('b' in "models 'a' and 'b'
            # both listen on ..."); point at the last entry named, the one that clashes.
            named = [
                (message.rfind(repr(k[-1])), k)
                for k in self.marks
                if k[:-1] == loc and isinstance(k[-1], str) and repr(k[-1]) in message
            ]
            if named:
                loc = max(named)[1]
                marks = self.marks[loc]
        return f"{self.path}:{marks.key}: {_dotted(loc) + ': ' if loc else ''}{message}"


def _position(line: str) -> tuple[int, int]:
    """Where a described error points (``FILE:LINE:COL: ...``): errors are listed in the file's order."""
    m = re.search(r":(\d+):(\d+): ", line)
    return (int(m[1]), int(m[2])) if m else (0, 0)


def _unknown_key(loc: Loc) -> str:
    model = _model_at(loc[:-1])
    if model is None:
        return "unknown key"
    fields = [f for f in model.model_fields if f not in INTERNAL_FIELDS]
    close = difflib.get_close_matches(str(loc[-1]), fields, n=1)
    if close:
        return f"unknown key; did you mean '{close[0]}'?"
    return f"unknown key; expected one of: {', '.join(fields)}"


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The pydantic model that validates the mapping at ``loc`` (``models.x`` -> ``ModelConfig``)."""
    tp: object = Config
    for part in loc:
        if part in ENTRY_KINDS:  # a model entry's kind, as pydantic's union tags it
            tp = ENTRY_KINDS[str(part)]
            continue
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(str(part))
            if field is None:
                return None
            tp = field.annotation
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) in (list, tuple):
            tp = typing.get_args(tp)[0]
        else:
            return None
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            tp = args[0] if len(args) == 1 else None
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None
