"""A settings push from the daemon, judged: the same entry with only live keys changed.

Pure: ``judge_update`` says what to do with a pushed entry; the worker's private app applies
it. Error texts name keys, never values, so a secret cannot leak through a refusal.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

from ..config.diff import changed_fields, classify
from ..config.schema import ResolvedModel


@dataclass(frozen=True)
class SettingsRefused(Exception):
    """A push the worker will not apply: ``status`` 422 (not a valid entry) or 409 (needs a new worker)."""

    status: int
    message: str
    forcing: tuple[str, ...] = ()


def judge_update(current: ResolvedModel, data: object) -> tuple[ResolvedModel, tuple[str, ...]]:
    """The new config and the keys it changes; raises ``SettingsRefused`` when it cannot apply live."""
    if not isinstance(data, dict):
        raise SettingsRefused(422, "the body must be the model entry as a JSON object")
    try:
        new = ResolvedModel.model_validate(data)
    except ValidationError as exc:
        # include_input=False: the offending value may be the API key.
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'entry'}: {e['msg']}"
            for e in exc.errors(include_input=False, include_url=False)
        )
        raise SettingsRefused(422, f"not a valid model entry: {problems}") from None
    change = classify(changed_fields(current, new))
    if not change.live:
        raise SettingsRefused(
            409, f"{', '.join(change.forcing)} cannot change in a running worker: start a new one", change.forcing
        )
    return new, change.keys
