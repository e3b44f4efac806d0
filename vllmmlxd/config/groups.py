"""Replica sets: entries that set the same ``group: NAME`` are answered by the gateway under NAME.

Checked here, over the whole ``models:`` section, so that a set the gateway cannot route is refused
at load: the name must be one no entry answers to, a set has two members at least, its members let
the same callers in (the gateway checks a set's key before it picks a member), and only the gateway
answers a group's name. Messages name entries, never a value (a group's name neither).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from .entries import EntryConfig
from .names import NAME_RE


def members_by_group(models: Mapping[str, EntryConfig]) -> dict[str, list[str]]:
    """Each group's member entries, in the config's order."""
    groups: dict[str, list[str]] = {}
    for name, entry in models.items():
        if entry.group is not None:
            groups.setdefault(entry.group, []).append(name)
    return groups


# Member states from the most hopeful: a set shows the best of its members'.
_HOPEFUL = ("ready", "idle", "loading", "starting", "unloaded", "backoff", "draining", "unreachable")


def set_state(states: Sequence[str]) -> str:
    """A set's state from its members': ``ready`` while one serves (ready or idle), else the most
    hopeful member's (loading before backoff before failed...)."""
    for hopeful in _HOPEFUL:
        if hopeful in states:
            return "ready" if hopeful == "idle" else hopeful
    return states[0] if states else "unknown"


def _callers(entry: EntryConfig) -> tuple[str | None, tuple[str, ...] | None]:
    # The entry's own key is compared by its digest (never shown); api_keys as a set of names.
    key = entry.api_key.get_secret_value() if entry.api_key is not None else None
    return key, tuple(sorted(set(entry.api_keys))) if entry.api_keys is not None else None


def check_groups(models: Mapping[str, EntryConfig], has_gateway: bool) -> None:
    """Raise ``ValueError`` for the first group that cannot be routed (the message ends with the entry
    to change, which is where the loader points)."""
    groups = members_by_group(models)
    answers: dict[str, str] = {}  # every name an entry answers to -> that entry
    for name, entry in models.items():
        for n in (name, entry.display_name(name), *entry.aliases):
            answers.setdefault(n, name)
    for group, members in groups.items():
        first = members[0]
        # The group's name is a value: never in a message (it could be a secret written under the wrong key).
        if not NAME_RE.match(group):
            raise ValueError(f"group must be letters, digits, '_', '.' or '-' (model {first!r})")
        if not has_gateway:
            raise ValueError(f"group needs a gateway section: the gateway answers a group's name (model {first!r})")
        if group in answers:
            raise ValueError(
                f"model {answers[group]!r} already answers to the name of the group of model {first!r} (as its "
                f"key, served_model_name or an alias): a group needs a name of its own (model {first!r})"
            )
        if len(members) < 2:
            raise ValueError(
                f"group has one entry: a group needs at least 2, each with the same group (model {first!r})"
            )
        differ = [m for m in members[1:] if _callers(models[m]) != _callers(models[first])]
        if differ:
            raise ValueError(
                f"entries of one group differ in who may call them: give them the same api_key/api_keys "
                f"(model {first!r} and {', '.join(repr(m) for m in differ)})"
            )
