"""`vllmmlxd serve`'s flags become one ModelConfig; a refused flag is one line naming it, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from vllmmlxd.cli import _api_key, _serve_parser, serve_config
from vllmmlxd.config.keys import DIGEST_PREFIX, key_digest


def parse(*argv: str) -> argparse.Namespace:
    sub = argparse.ArgumentParser().add_subparsers()
    parser = _serve_parser(sub)
    args = parser.parse_args(argv)
    args.api_key = None
    return args


def test_the_environment_variable_gives_the_key_and_only_one_way_may(tmp_path, monkeypatch):
    sub = argparse.ArgumentParser().add_subparsers()
    parser = _serve_parser(sub)
    monkeypatch.setenv("VLLMMLXD_API_KEY", "sk-from-env")
    args = parser.parse_args(["builtin:tiny"])
    args.api_key = _api_key(args, parser)
    assert serve_config(args).api_key.get_secret_value() == DIGEST_PREFIX + key_digest("sk-from-env")
    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    with pytest.raises(SystemExit):  # the environment and a flag: which one was meant is not guessed
        _api_key(parser.parse_args(["builtin:tiny", "--api-key-file", str(key_file)]), parser)
    monkeypatch.setenv("VLLMMLXD_API_KEY", "")
    assert _api_key(parser.parse_args(["builtin:tiny", "--api-key-file", str(key_file)]), parser) == "sk-from-file"


def test_flags_left_out_take_the_entrys_defaults():
    config = serve_config(parse("builtin:tiny"))
    assert (config.max_tokens, config.max_request_tokens, config.max_queue) == (32768, 32768, 64)
    assert config.served_model_name == "builtin:tiny"


def test_the_kv_budget_flag_sets_the_entrys_field():
    assert serve_config(parse("builtin:tiny")).max_kv_memory_mb is None  # the default: what is left
    assert serve_config(parse("builtin:tiny", "--max-kv-memory-mb", "0.5")).max_kv_memory_mb == 0.5


def test_a_cap_alone_lowers_the_default():
    config = serve_config(parse("builtin:tiny", "--max-request-tokens", "16"))
    assert (config.max_tokens, config.max_request_tokens) == (16, 16)


def serve_error(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "vllmmlxd.cli", "serve", *flags], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize(
    "flags, line",
    [
        (
            ("builtin:tiny", "--max-tokens", "64", "--max-request-tokens", "16"),
            "vllmmlxd serve: error: --max-tokens (64), the default, is larger than --max-request-tokens (16), the cap: "
            "lower --max-tokens or leave it out",
        ),
        (
            ("builtin:tiny", "--max-queue", "0"),
            "vllmmlxd serve: error: --max-queue: Input should be greater than or equal to 1",
        ),
        (
            ("builtin:tiny", "--blas", "sk-not-shown"),
            "vllmmlxd serve: error: --blas: blas must be one of auto, mkl, blis, openblas, bundled or a path to a shared library",
        ),
        (
            ("builtin:tinyy",),
            "vllmmlxd serve: error: MODEL: unknown builtin model; the builtins are builtin:all-minilm-l6-v2, "
            "builtin:smollm2-135m-instruct, builtin:tiny, builtin:tiny-vlm",
        ),
    ],
)
def test_a_refused_entry_is_one_line_naming_the_flag(flags, line):
    r = serve_error(*flags)
    assert r.returncode == 2 and r.stderr == line + "\n" and r.stdout == ""


@pytest.mark.parametrize(
    "entry, says",
    [
        (
            "max_tokens: 64\n    max_request_tokens: 16",
            "models.a: max_tokens (64), the default, is larger than max_request_tokens",
        ),
        ("max_queue: 0", "models.a.max_queue: Input should be greater than or equal to 1"),
    ],
)
def test_run_and_check_refuse_a_bad_entry_in_one_line_naming_the_key(tmp_path, capsys, entry, says):
    from vllmmlxd.ctl.cli import main as ctl_main

    path = tmp_path / "c.yaml"
    path.write_text(
        f"daemon:\n  state_dir: {tmp_path / 'state'}\nmodels:\n  a:\n    model: builtin:tiny\n    {entry}\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "vllmmlxd.cli", "run", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    [line] = r.stderr.splitlines()
    assert r.returncode == 78 and "event=config.invalid" in line and says in line
    assert ctl_main(["check", str(path)]) == 1
    out, err = capsys.readouterr()
    [line] = err.splitlines()
    assert out == "" and line.startswith(f"{path}:") and says in line


def test_prompt_lookup_is_on_unless_an_entry_or_a_flag_turns_it_off():
    from vllmmlxd.config.entries import ModelConfig

    default = serve_config(parse("builtin:tiny")).speculative
    assert default is not None and default.method == "prompt-lookup" and default.adaptive
    assert serve_config(parse("builtin:tiny", "--speculative", "off")).speculative is None
    tuned = serve_config(parse("builtin:tiny", "--num-draft", "8")).speculative  # a field alone: prompt lookup's
    assert tuned is not None and tuned.method == "prompt-lookup" and tuned.num_draft == 8
    for off in (False, None, "off"):
        assert ModelConfig(model="builtin:tiny", speculative=off).speculative is None
    assert ModelConfig(model="builtin:tiny").speculative == default
