"""What a reload changes: a pure comparison of two configs.

The supervisor restarts only the workers whose entries changed, starts the added,
stops the removed and leaves the rest alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, SecretStr

from vllmmlxd.config.schema import Config

# Daemon keys read once at start-up: the socket is bound and the state dir opened then.
RESTART_REQUIRED_FIELDS = frozenset({"state_dir", "control_socket"})


@dataclass(frozen=True)
class ReloadPlan:
    """Model entries added, removed, changed (with the changed fields) and unchanged, plus the daemon section."""

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: dict[str, tuple[str, ...]] = field(default_factory=dict)
    unchanged: tuple[str, ...] = ()
    daemon_changed: tuple[str, ...] = ()
    restart_required: tuple[str, ...] = ()  # daemon fields that changed but apply only after a restart

    @property
    def is_empty(self) -> bool:
        """True when the reload would change nothing."""
        return not (self.added or self.removed or self.changed or self.daemon_changed)

    def render(self) -> str:
        """Lines for people: ``added: x``, ``changed: y (port, timeout)``, ``removed: z``, ``unchanged: a, b``."""
        lines = []
        if self.is_empty:
            lines.append("no changes")
        if self.added:
            lines.append(f"added: {', '.join(self.added)}")
        if self.changed:
            lines.append("changed: " + ", ".join(f"{n} ({', '.join(fs)})" for n, fs in self.changed.items()))
        if self.removed:
            lines.append(f"removed: {', '.join(self.removed)}")
        if self.unchanged:
            lines.append(f"unchanged: {', '.join(self.unchanged)}")
        if self.daemon_changed:
            lines.append(f"daemon changed: {', '.join(self.daemon_changed)}")
        if self.restart_required:
            lines.append(f"restart required: {', '.join(self.restart_required)}")
        return "\n".join(lines)


def diff_models(old: Config | None, new: Config) -> ReloadPlan:
    """Compare ``old`` (None on first load: everything is added) with ``new``."""
    if old is None:
        return ReloadPlan(added=tuple(sorted(new.models)))
    changed = {}
    unchanged = []
    for name in sorted(old.models.keys() & new.models.keys()):
        fields = changed_fields(old.models[name], new.models[name])
        if fields:
            changed[name] = fields
        else:
            unchanged.append(name)
    daemon_changed = changed_fields(old.daemon, new.daemon)
    return ReloadPlan(
        added=tuple(sorted(new.models.keys() - old.models.keys())),
        removed=tuple(sorted(old.models.keys() - new.models.keys())),
        changed=changed,
        unchanged=tuple(unchanged),
        daemon_changed=daemon_changed,
        restart_required=tuple(f for f in daemon_changed if f in RESTART_REQUIRED_FIELDS),
    )


def changed_fields(old: BaseModel, new: BaseModel) -> tuple[str, ...]:
    """Sorted names of the fields whose values differ between two models of the same class."""
    return tuple(sorted(f for f in type(new).model_fields if not _same(getattr(old, f), getattr(new, f))))


def _same(a: object, b: object) -> bool:
    # Compare what a secret holds, not its masked '**********' form.
    if isinstance(a, SecretStr) and isinstance(b, SecretStr):
        return a.get_secret_value() == b.get_secret_value()
    return a == b
