"""A model entry's keys as ``vllmmlxd serve`` flags, made from the schema.

Each key of ``ModelConfig`` is a flag named after it (``max_queue`` -> ``--max-queue``), typed
from its annotation, its help its description, grouped in ``--help`` by its concern; a section's
keys are flags of their own (``cache_disk.dir`` -> ``--cache-disk-dir``). A new key is a flag
with no line here. A key that cannot be one says why in ``NOT_FLAGS``; ``FLAG_FORMS`` keeps the
names and forms of the reference server's flags where a key's own would differ. A test holds
the flags and the schema together.
"""

from __future__ import annotations

import argparse
import functools
import operator
import types
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from .entries import CONCERNS, INTERNAL_FIELDS, ModelConfig
from .names import REASONING_PARSERS, TOOL_PARSERS
from .speculative import OFF, SPECULATIVE_METHODS

# Keys `vllmmlxd serve` takes no flag for, and why: each needs the daemon or another section of a config file.
NOT_FLAGS: dict[str, str] = {
    "api_keys": "names from a config file's api_keys section",
    "group": "a replica set is answered by the daemon's gateway",
    "load": "serve loads its model at start and keeps it",
    "idle_unload_s": "serve loads its model at start and keeps it",
    "download": "the daemon's model store downloads models; serve loads the one it is given",
    "mcp": "names from a config file's mcp_servers section (serve takes --mcp-config)",
    "distributed": "the daemon starts and supervises a model's ranks on several hosts",
}
# Keys the command line declares itself: the model is its argument, and the key may come from
# --api-key-file or $VLLMMLXD_API_KEY instead (out of `ps`).
OWN_FLAGS: dict[str, str] = {"model": "MODEL", "api_key": "--api-key"}

# The reference server's names and forms, where a key's own would differ. "flag" renames it;
# "off": the value off turns the flag's section off; the rest are add_argument's keywords.
FLAG_FORMS: dict[str, dict[str, Any]] = {
    "served_model_name": {"help": "the name clients see (default: the model spec)"},
    "allowed_hosts": {"metavar": "NAME,..."},
    "cors_origins": {"metavar": "ORIGIN,..."},
    "trusted_proxies": {"metavar": "NETWORK,..."},
    "allowed_image_hosts": {"nargs": "*", "type": str, "metavar": "HOST"},
    "embedding_model": {"metavar": "SPEC"},
    "mcp_config": {"metavar": "FILE"},
    "reasoning_parser": {"choices": REASONING_PARSERS},
    "tool_call_parser": {"choices": TOOL_PARSERS},
    "cache_disk.dir": {"metavar": "DIR", "help": "write the prefix cache's blocks to disk too, here"},
    "cache_disk.budget_gb": {"metavar": "GB"},
    "speculative.method": {
        "flag": "--speculative",
        "off": True,
        "choices": (*SPECULATIVE_METHODS, OFF),
        "help": "prompt-lookup (the default): drafts from each request's own prompt and output; "
        "draft: a small model drafts; off",
    },
    "speculative.num_draft": {"flag": "--num-draft"},
    "speculative.ngram": {"flag": "--ngram"},
    "speculative.draft_model": {"flag": "--draft-model", "metavar": "SPEC"},
    "speculative.adaptive": {
        "flag": "--no-adaptive-speculation",
        "action": "store_const",
        "const": False,
        "help": "every request drafts --num-draft tokens every step (default: only where it pays)",
    },
}
# The groups of the entry's own sections in --help (the others are their concern's).
SECTION_GROUPS = {
    "cache_disk": "prefix cache and KV",
    "speculative": "speculative decoding (prompt lookup, adaptive, unless --speculative off)",
}


@dataclass(frozen=True)
class Flag:
    """One entry key as a flag: ``key`` is the entry's (``section.key`` for a section's)."""

    key: str
    name: str
    group: str
    options: dict[str, Any]
    turns_off: bool = False  # its value `off` turns its section off

    @property
    def dest(self) -> str:
        return self.key.replace(".", "_")


def names_list(text: str) -> tuple[str, ...]:
    """A comma-separated flag value as a tuple of names."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def int_or_text(text: str) -> int | str:
    """A count (``120``), else the text as given (``120/minute``)."""
    return int(text) if text.strip().isdigit() else text


def serve_flags(entry: type[ModelConfig] = ModelConfig) -> list[Flag]:
    """Every key of ``entry`` as a flag but those in ``NOT_FLAGS``, ``OWN_FLAGS`` and the internal ones.

    Raises ``TypeError`` naming a key whose type has no flag form: give it one in ``FLAG_FORMS``,
    or say in ``NOT_FLAGS`` why it is not a flag."""
    concern = {key: title for title, model in CONCERNS.items() for key in model.model_fields}
    flags: list[Flag] = []
    for key, info in entry.model_fields.items():
        if key in NOT_FLAGS or key in OWN_FLAGS or key in INTERNAL_FIELDS:
            continue
        section = _section(info.annotation)
        if section is None:
            flags.append(_flag(key, info, concern.get(key, "model")))
            continue
        group = SECTION_GROUPS.get(key) or concern.get(key, key)
        flags += [_flag(f"{key}.{sub}", sub_info, group) for sub, sub_info in section.model_fields.items()]
    return flags


def add_flags(parser: argparse.ArgumentParser, flags: Iterable[Flag]) -> None:
    """Add ``flags`` to ``parser``, one argument group per concern."""
    groups: dict[str, argparse._ArgumentGroup] = {}
    for flag in flags:
        group = groups.get(flag.group) or groups.setdefault(flag.group, parser.add_argument_group(flag.group))
        group.add_argument(flag.name, dest=flag.dest, **flag.options)


def entry_values(args: argparse.Namespace, flags: Iterable[Flag]) -> dict[str, Any]:
    """The entry's keys the flags in ``args`` give: a section as the mapping of its flags given,
    or False when one says ``off``. Flags left out are absent: the entry's defaults apply."""
    given: dict[str, Any] = {}
    for flag in flags:
        value = getattr(args, flag.dest, None)
        if value is None:
            continue
        section, _, key = flag.key.rpartition(".")
        value = tuple(value) if isinstance(value, list) else value
        if not section:
            given[key] = value
        elif flag.turns_off and value == OFF:
            given[section] = False
        elif given.get(section) is not False:
            given.setdefault(section, {})[key] = value
    return given


def flag_name(loc: Sequence[int | str], flags: Iterable[Flag]) -> str:
    """The flag an error's location names: ``("speculative", "num_draft")`` -> ``--num-draft``."""
    names = {**{f.key: f.name for f in flags}, **OWN_FLAGS}
    parts = [str(p) for p in loc if isinstance(p, str)]
    for n in (2, 1):
        if len(parts) >= n and ".".join(parts[:n]) in names:
            return names[".".join(parts[:n])]
    return "--" + parts[0].replace("_", "-") if parts else "MODEL"


def _flag(key: str, info: FieldInfo, group: str) -> Flag:
    form = dict(FLAG_FORMS.get(key, {}))
    name = form.pop("flag", "--" + key.replace(".", "-").replace("_", "-"))
    turns_off = bool(form.pop("off", False))
    options = {"default": None, **_typed(key, info), **form}
    if "type" in options and "metavar" not in options and "choices" not in options:
        options["metavar"] = key.rpartition(".")[2].upper()
    options["help"] = _help(options.get("help") or info.description or "", info.default, options)
    return Flag(key, name, group, options, turns_off)


def _typed(key: str, info: FieldInfo) -> dict[str, Any]:
    """add_argument's type, choices or action for the field's type."""
    tp = _bare(info.annotation)
    if tp is bool:
        return {"action": argparse.BooleanOptionalAction if info.default is True else "store_true"}
    if typing.get_origin(tp) is Literal:
        choices = typing.get_args(tp)
        return {"type": type(choices[0]), "choices": choices}
    if typing.get_origin(tp) is tuple:
        return {"type": names_list, "metavar": "NAME,..."}
    if tp in (int, float, str):
        return {"type": tp}
    if _is_union(tp) and set(typing.get_args(tp)) == {int, str}:
        return {"type": int_or_text}
    raise TypeError(f"{key}: no flag form for {info.annotation}; give it one in FLAG_FORMS, or say why in NOT_FLAGS")


def _help(text: str, default: object, options: dict[str, Any]) -> str:
    shown = options.get("action") is None and default is not None and not isinstance(default, tuple)
    if shown and "default" not in text and type(default) in (int, float, str):
        text += f" (default: {default})"
    return text.replace("%", "%%")


def _section(annotation: object) -> type[BaseModel] | None:
    tp = _bare(annotation)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _bare(annotation: object) -> Any:
    """The type without ``Annotated`` and ``| None``."""
    tp = annotation
    while True:
        if typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
        elif _is_union(tp) and type(None) in typing.get_args(tp):
            rest = tuple(a for a in typing.get_args(tp) if a is not type(None))
            tp = rest[0] if len(rest) == 1 else functools.reduce(operator.or_, rest)
        else:
            return tp


def _is_union(tp: object) -> bool:
    return typing.get_origin(tp) in (typing.Union, types.UnionType)
