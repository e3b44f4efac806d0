"""vllmmlxctl finds the daemon `brew services` runs without flags: the Homebrew candidates for its
socket, and when they give way to the user's own default. A tmp dir stands for the prefix, a file
for the socket."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllmmlxd.ctl import client, exit_codes
from vllmmlxd.ctl.cli import main
from vllmmlxd.ctl.client import (
    HOMEBREW_ORIGIN,
    HOMEBREW_PREFIXES,
    homebrew_prefixes,
    homebrew_socket,
    resolve_socket,
    socket_origin,
    unreachable_hint,
)


def brewed_socket(prefix: Path) -> Path:
    """A file where the Homebrew service's control socket would be."""
    path = prefix / "var" / "vllmmlxd" / "control.sock"
    path.parent.mkdir(parents=True)
    path.touch()
    return path


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    """An empty home: the user's default socket is absent, and no state dir is named."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / ".local" / "state"))
    for name in ("VLLMMLXD_STATE_DIR", "VLLMMLXD_SOCKET", "HOMEBREW_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(client, "HOMEBREW_PREFIXES", ())  # this machine's own Homebrew stays out of it
    return home


def test_prefixes_come_from_the_environment_then_the_interpreter_then_homebrews_defaults():
    cellar = "/brew/Cellar/vllmmlxd/0.1.0/libexec/bin/python"
    assert homebrew_prefixes({"HOMEBREW_PREFIX": "/env"}, cellar) == [Path("/env"), Path("/brew"), *HOMEBREW_PREFIXES]
    assert homebrew_prefixes({}, "/brew/opt/vllmmlxd/libexec/bin/python")[0] == Path("/brew")
    # Another interpreter, or a folder named vllmmlxd right under /opt, says nothing of a prefix.
    assert homebrew_prefixes({}, "/work/.venv/bin/python") == list(HOMEBREW_PREFIXES)
    assert homebrew_prefixes({}, "/opt/vllmmlxd/.venv/bin/python") == list(HOMEBREW_PREFIXES)
    # Each once, in order.
    in_order = [Path("/opt/homebrew"), Path("/brew"), Path("/usr/local")]
    assert homebrew_prefixes({"HOMEBREW_PREFIX": "/opt/homebrew"}, cellar) == in_order
    assert (Path("/opt/homebrew"), Path("/usr/local")) == HOMEBREW_PREFIXES


def test_the_first_prefix_with_a_socket_is_taken(tmp_path, home):
    first, second = tmp_path / "first", tmp_path / "second"
    assert homebrew_socket({"HOMEBREW_PREFIX": str(first)}, "/usr/bin/python3") is None
    found = brewed_socket(second)
    interpreter = f"{second}/Cellar/vllmmlxd/HEAD/libexec/bin/python"
    assert homebrew_socket({"HOMEBREW_PREFIX": str(first)}, interpreter) == found
    assert homebrew_socket({}, f"{second}/opt/vllmmlxd/libexec/bin/python") == found
    assert homebrew_socket({}, "/usr/bin/python3") is None


def test_without_flags_the_homebrew_socket_is_used_when_the_users_own_is_absent(tmp_path, home):
    prefix = tmp_path / "prefix"
    found = brewed_socket(prefix)
    env = {"HOMEBREW_PREFIX": str(prefix)}
    assert resolve_socket(None, None, env) == found
    assert socket_origin(None, None, env) == HOMEBREW_ORIGIN
    # Derived from the interpreter when the shell has no $HOMEBREW_PREFIX (launchd's, a script's).
    cellar = f"{prefix}/Cellar/vllmmlxd/HEAD/libexec/bin/python"
    assert resolve_socket(None, None, {}, executable=cellar) == found


def test_the_users_own_socket_and_every_flag_still_come_first(tmp_path, home, monkeypatch):
    env = {"HOMEBREW_PREFIX": str(tmp_path / "prefix")}
    brewed_socket(tmp_path / "prefix")
    assert resolve_socket("/x.sock", None, env) == Path("/x.sock")
    assert resolve_socket(None, None, {**env, "VLLMMLXD_SOCKET": "/e.sock"}) == Path("/e.sock")
    config = tmp_path / "c.yaml"
    config.write_text(f"daemon:\n  state_dir: {tmp_path}/s\n")
    assert resolve_socket(None, str(config), env) == tmp_path / "s" / "control.sock"
    # A state dir named in $VLLMMLXD_STATE_DIR is a choice: its socket, even absent.
    monkeypatch.setenv("VLLMMLXD_STATE_DIR", str(tmp_path / "mine"))
    named = {**env, "VLLMMLXD_STATE_DIR": str(tmp_path / "mine")}
    assert resolve_socket(None, None, named) == tmp_path / "mine" / "control.sock"
    assert socket_origin(None, None, named) == "the default"
    monkeypatch.delenv("VLLMMLXD_STATE_DIR")
    own = client.control_socket_path()  # the platform's default under the fake home
    own.parent.mkdir(parents=True)
    own.touch()
    assert resolve_socket(None, None, env) == own
    assert socket_origin(None, None, env) == "the default"


def test_an_unreachable_homebrew_daemon_points_at_brew_services(tmp_path, home, monkeypatch, capsys):
    prefix = tmp_path / "prefix"
    found = brewed_socket(prefix)  # a plain file: what is left when nothing listens
    monkeypatch.setenv("HOMEBREW_PREFIX", str(prefix))
    assert main(["status"]) == exit_codes.UNREACHABLE
    err = capsys.readouterr().err
    assert f"cannot reach the daemon at {found}" in err
    assert f"(that socket is {HOMEBREW_ORIGIN}) is it running? `brew services info vllmmlxd`" in err
    assert "$(brew --prefix)/var/log/vllmmlxd/vllmmlxd.log" in unreachable_hint(HOMEBREW_ORIGIN)
