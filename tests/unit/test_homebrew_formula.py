"""Formula/vllmmlxd.rb, the Homebrew formula: Ruby parses it, and tests/support/homebrew_dsl.rb (a stub
of Homebrew's DSL) evaluates it under a fake prefix. Its service runs a command line vllmmlxd's own
parser accepts, on the paths service_files.py's Homebrew defaults and vllmmlxctl agree on, and the
config post_install writes passes vllmmlxctl check. Homebrew itself never runs here."""

from __future__ import annotations

import json
import plistlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from vllmmlxd import cli, service_files
from vllmmlxd.config.load import load_config
from vllmmlxd.control.protocol import control_socket_path
from vllmmlxd.ctl import client, exit_codes
from vllmmlxd.ctl.cli import main as ctl_main

REPO = Path(__file__).resolve().parents[2]
FORMULA = REPO / "Formula" / "vllmmlxd.rb"
STUB = REPO / "tests" / "support" / "homebrew_dsl.rb"
RUBY = shutil.which("ruby")
TEMPLATE_PREFIX = Path("/opt/homebrew")  # service_files.TEMPLATE_LAUNCHD's prefix
SCRIPTS = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]

pytestmark = pytest.mark.skipif(RUBY is None, reason="ruby is not installed (make test's system-deps install it)")


def evaluate(prefix: Path, testpath: Path, *phases: str) -> dict:
    """The stub's JSON for these phases of the formula, under ``prefix``."""
    argv = [str(RUBY), str(STUB), str(FORMULA), str(prefix), str(REPO), str(testpath), *phases]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def brewed(tmp_path_factory) -> tuple[Path, dict]:
    """The prefix and the stub's account of install, post_install, the service and the test block."""
    root = tmp_path_factory.mktemp("brew")
    prefix, testpath = root / "prefix", root / "test"
    testpath.mkdir()
    installed = evaluate(prefix, testpath, "install")
    # What pip would put in the virtualenv, stood for by this checkout's own scripts: the test block runs them.
    venv_bin = Path(installed["install"]["virtualenv"]["root"]) / "bin"
    venv_bin.mkdir(parents=True)
    for name in SCRIPTS:
        (venv_bin / name).symlink_to(Path(sys.executable).parent / name)
    return prefix, {**installed, **evaluate(prefix, testpath, "post_install", "service", "test")}


def rebased(path: Path, prefix: Path) -> Path:
    """A path of service_files' Homebrew template, under ``prefix`` instead of /opt/homebrew."""
    return prefix / Path(path).relative_to(TEMPLATE_PREFIX)


def test_ruby_parses_the_formula():
    done = subprocess.run([str(RUBY), "-c", str(FORMULA)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Syntax OK" in done.stdout, done.stderr


def test_it_installs_this_checkout_into_its_own_python_312_virtualenv(brewed):
    prefix, out = brewed
    spec, install = out["spec"], out["install"]
    assert out["name"] == "vllmmlxd"
    assert {"arch": "arm64"} in spec["depends_on"] and "macos" in spec["depends_on"]
    assert "python@3.12" in spec["depends_on"]
    # No release yet: HEAD from main, and a url only ever with its checksum.
    assert spec["head"]["branch"] == "main" and spec["head"]["url"].endswith("/vllmmlxd.git")
    assert ("url" in spec) == ("sha256" in spec)
    venv = install["virtualenv"]
    assert venv["python"] == "python3.12" and not venv["system_site_packages"]
    assert Path(venv["root"]) == prefix / "Cellar" / "vllmmlxd" / "HEAD" / "libexec"
    [pip] = install["system"]
    assert pip[:3] == ["python3.12", "-m", "pip"] and pip[3] == f"--python={venv['root']}/bin/python"
    assert pip[4:] == ["install", str(REPO)]
    # Every command of the package, and only those, linked into bin.
    links = {Path(s["link"]).name: Path(s["target"]) for s in install["symlinks"]}
    assert set(links) == set(SCRIPTS)
    assert all(target == Path(venv["root"]) / "bin" / name for name, target in links.items())


def test_the_formulas_own_test_block_passes_against_this_checkout(brewed):
    assert brewed[1]["test"] == "passed"


def test_the_service_runs_what_vllmmlxd_run_accepts(brewed, monkeypatch):
    prefix, out = brewed
    run = out["service"]["run"]
    assert Path(run[0]) == prefix / "opt" / "vllmmlxd" / "bin" / "vllmmlxd"
    assert SCRIPTS[Path(run[0]).name] == "vllmmlxd.cli:main"
    started = []
    monkeypatch.setattr("vllmmlxd.daemon.run", lambda config, state_dir: started.append((config, state_dir)) or 0)
    assert cli.main(run[1:]) == 0  # vllmmlxd's own parser: a renamed flag exits 2 here
    assert started == [(str(prefix / "etc" / "vllmmlxd" / "config.yaml"), None)]


def test_the_service_agrees_with_service_files_homebrew_defaults(brewed):
    prefix, out = brewed
    service = out["service"]
    template = service_files.TEMPLATE_LAUNCHD
    config = rebased(template["config"], prefix)
    assert service["run"][3] == str(config) == out["post_install"]["config"]
    state_dir = load_config(str(config)).config.daemon.state_dir
    assert state_dir == rebased(template["state_dir"], prefix) == Path(service["working_dir"])
    log = Path(service["log_path"])
    assert service["error_log_path"] == str(log) and log.name == service_files.LOG_NAME
    assert log.parent == rebased(template["log_dir"], prefix)
    # The launchd behaviour `vllmmlxctl install-service` gives its plist.
    plist = plistlib.loads(service_files.render_launchd_plist(service["run"][0], config, state_dir, log.parent))
    assert service["run"][1:] == plist["ProgramArguments"][1:]
    assert {"SuccessfulExit": service["keep_alive"]["successful_exit"]} == plist["KeepAlive"]
    assert service["throttle_interval"] == plist["ThrottleInterval"]
    assert service["process_type"].capitalize() == plist["ProcessType"]
    assert service["run_at_load"] is plist["RunAtLoad"] is True


def test_vllmmlxctl_finds_the_services_socket_without_flags(brewed, tmp_path, monkeypatch):
    prefix, out = brewed
    daemon = load_config(out["post_install"]["config"]).config.daemon
    socket = control_socket_path(daemon.control_socket, daemon.state_dir)  # as the daemon computes it
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.delenv("VLLMMLXD_STATE_DIR", raising=False)
    monkeypatch.setattr(client, "HOMEBREW_PREFIXES", ())
    socket.touch()
    try:
        assert client.resolve_socket(None, None, {"HOMEBREW_PREFIX": str(prefix)}) == socket
        python = out["install"]["virtualenv"]["root"] + "/bin/python"  # what the linked scripts run on
        assert client.resolve_socket(None, None, {}, executable=python) == socket
        assert client.socket_origin(None, None, {}, executable=python) == client.HOMEBREW_ORIGIN
    finally:
        socket.unlink()


def test_the_config_post_install_writes_is_the_projects_default_and_passes_check(brewed, monkeypatch, capsys):
    from vllmmlxd.runtime import memory

    prefix, out = brewed
    config = Path(out["post_install"]["config"])
    for folder in ("etc/vllmmlxd", "var/vllmmlxd", "var/log/vllmmlxd"):
        assert (prefix / folder).is_dir()
    written = yaml.safe_load(config.read_text())
    assert written.pop("daemon") == {"state_dir": str(prefix / "var" / "vllmmlxd")}
    assert written == yaml.safe_load((REPO / "config" / "default.yaml").read_text())
    monkeypatch.setattr(memory, "read_machine_memory", lambda: memory.MachineMemory(16 << 30, "MemTotal"))
    assert ctl_main(["check", str(config)]) == exit_codes.OK
    assert capsys.readouterr().out.startswith(f"{config}: ok (1 model: default)")


def test_post_install_never_rewrites_a_config_that_is_there(brewed, tmp_path):
    prefix, _ = brewed
    config = prefix / "etc" / "vllmmlxd" / "config.yaml"
    original = config.read_text()
    try:
        config.write_text("models: {}\n")
        evaluate(prefix, tmp_path, "post_install")
        assert config.read_text() == "models: {}\n"
    finally:
        config.write_text(original)
