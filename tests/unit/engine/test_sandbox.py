"""A model's chat template cannot run Python (the shape of CVE-2024-34359): templates are only
ever rendered in jinja's immutable sandbox, an escape on a plain conversation fails the load with
a clear reason, and one hidden behind a condition is refused per request."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

import vllmmlxd
from tests.support.servers import free_port
from vllmmlxd.api.prompt import render_template
from vllmmlxd.engine.loading import builtin
from vllmmlxd.engine.loading.loader import load_model
from vllmmlxd.engine.mlx_engine import MLXEngine
from vllmmlxd.engine.text.template_vars import template_switches
from vllmmlxd.errors import InvalidRequest, ModelLoadError

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def escapes(marker: Path) -> list[str]:
    """Template snippets that, outside a sandbox, run a shell command creating ``marker``."""
    cmd = f"touch {marker}"
    return [
        "{{ cycler.__init__.__globals__.os.popen('" + cmd + "').read() }}",
        "{% for c in ''.__class__.__mro__[1].__subclasses__() %}"
        "{% if c.__name__ == 'Popen' and c.__module__ == 'subprocess' %}"
        "{{ c('" + cmd + "', shell=True).wait() }}{% endif %}{% endfor %}",
    ]


def hostile_model(tmp_path: Path, state_dir: Path, template: str) -> Path:
    """builtin:tiny with ``template`` as its chat template (weights linked, not copied)."""
    source = builtin.ensure_builtin("tiny", state_dir)
    folder = tmp_path / "hostile"
    folder.mkdir()
    for f in source.iterdir():
        if f.name == "model.safetensors":
            (folder / f.name).symlink_to(f)
        elif f.is_file():
            shutil.copy(f, folder / f.name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("which", [0, 1])
def test_the_payloads_do_run_without_a_sandbox(tmp_path, which):
    # The control: the escapes are real, so their failing below is the sandbox's doing.
    marker = tmp_path / "ran"
    jinja2.Environment().from_string(escapes(marker)[which]).render()
    assert marker.exists()


@pytest.mark.parametrize("which", [0, 1])
def test_an_escaping_template_fails_the_load_and_runs_nothing(tmp_path, state_dir, which):
    marker = tmp_path / "ran"
    folder = hostile_model(tmp_path, state_dir, escapes(marker)[which] + CHATML)
    loaded = load_model(str(folder), state_dir)
    with pytest.raises(ModelLoadError, match="template sandbox forbids"):
        MLXEngine(loaded)
    assert not marker.exists()


def test_serve_exits_with_the_load_failed_code_and_says_why(tmp_path, state_dir):
    marker = tmp_path / "ran"
    folder = hostile_model(tmp_path, state_dir, escapes(marker)[0] + CHATML)
    proc = subprocess.run(
        [sys.executable, "-m", "vllmmlxd.cli", "serve", str(folder), "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr[-2000:]  # EXIT_LOAD_FAILED: the daemon marks the model failed
    assert "model.load_failed" in proc.stderr + proc.stdout and "template sandbox forbids" in proc.stderr + proc.stdout
    assert not marker.exists()


class _Ctx:
    """Just what render_template reads of a serving context."""

    def __init__(self, engine: MLXEngine):
        self.engine = engine


def test_an_escape_behind_a_condition_is_a_400_and_runs_nothing(tmp_path, state_dir):
    marker = tmp_path / "ran"
    trigger = "{% if messages[-1].content == 'open sesame' %}" + escapes(marker)[0] + "{% endif %}"
    engine = MLXEngine(load_model(str(hostile_model(tmp_path, state_dir, trigger + CHATML)), state_dir))
    try:
        ctx = _Ctx(engine)
        assert asyncio.run(render_template(ctx, [{"role": "user", "content": "hi"}], None, None))  # loads, serves
        with pytest.raises(InvalidRequest, match=r"chat template rejected these messages: .*unsafe"):
            asyncio.run(render_template(ctx, [{"role": "user", "content": "open sesame"}], None, None))
    finally:
        engine.close()
    assert not marker.exists()


def test_transformers_renders_chat_templates_in_the_immutable_sandbox():
    # Guards an upgrade: every model source's template is rendered by transformers' compiler.
    from transformers.utils.chat_template_utils import _compile_jinja_template

    assert isinstance(_compile_jinja_template(CHATML).environment, ImmutableSandboxedEnvironment)


def test_no_module_builds_an_unsandboxed_jinja_environment():
    root = Path(vllmmlxd.__file__).parent
    plain = re.compile(r"jinja2\.(Environment|Template)\(|from jinja2 import .*\b(Environment|Template)\b")
    offenders = [
        f"{p.relative_to(root)}:{n}"
        for p in root.rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if plain.search(line)
    ]
    assert offenders == []


def test_template_switches_still_read_from_the_sandboxed_parser():
    assert template_switches("{% if enable_thinking %}x{% endif %}{{ messages }}{{ reasoning_effort }}") == {
        "enable_thinking",
        "reasoning_effort",
    }
