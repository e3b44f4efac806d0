"""`vllmmlxd serve`'s flags become one ModelConfig; a refused flag is one line naming it, never a traceback."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest
from pydantic import ValidationError

from vllmmlxd.cli import _api_key, _serve_parser, describe_flag_errors, serve_config
from vllmmlxd.config.cache import CacheDiskConfig
from vllmmlxd.config.keys import DIGEST_PREFIX, key_digest
from vllmmlxd.config.speculative import SpeculativeConfig


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
            "builtin:smollm2-135m-instruct, builtin:tiny, builtin:tiny-reranker, builtin:tiny-vlm, "
            "builtin:tiny-whisper",
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


# Every flag `vllmmlxd serve` took before its flags were made from the entry's schema (issue 38),
# as its parser listed them: each is still taken.
FLAGS_BEFORE_THE_SCHEMA = (
    "--host", "--port", "--served-model-name", "--owned-by", "--api-key", "--api-key-file", "--timeout",
    "--max-tokens", "--max-request-tokens", "--default-temperature", "--default-top-p", "--stream-interval",
    "--max-queue", "--max-connections", "--allowed-hosts", "--cors-origins", "--state-dir", "--log-level",
    "--rate-limit", "--enable-metrics", "--blas", "--threads", "--continuous-batching", "--no-continuous-batching",
    "--max-num-seqs", "--prefill-step-size", "--cache-memory-mb", "--cache-memory-percent", "--max-kv-memory-mb",
    "--use-paged-cache", "--no-use-paged-cache", "--cache-disk-dir", "--cache-disk-budget-gb", "--kv-bits",
    "--kv-group-size", "--enable-auto-tool-choice", "--no-enable-auto-tool-choice", "--tool-call-parser",
    "--reasoning-parser", "--strict-model-name", "--health-socket", "--embedding-model", "--mcp-config",
    "--max-images", "--max-image-mb", "--max-image-pixels", "--max-request-image-pixels", "--image-pixel-budget",
    "--allow-image-urls", "--allowed-image-hosts", "--image-url-timeout", "--speculative", "--num-draft", "--ngram",
    "--draft-model", "--no-adaptive-speculation",
)  # fmt: skip

# Each of them given, and what it set in the entry then (and still does).
MEANINGS = [
    (("--host", "0.0.0.0"), "host", "0.0.0.0"),
    (("--port", "9001"), "port", 9001),
    (("--served-model-name", "llama"), "served_model_name", "llama"),
    (("--owned-by", "me"), "owned_by", "me"),
    (("--timeout", "5"), "timeout", 5.0),
    (("--max-tokens", "64"), "max_tokens", 64),
    (("--max-request-tokens", "16"), "max_request_tokens", 16),
    (("--default-temperature", "0.5"), "default_temperature", 0.5),
    (("--default-top-p", "0.9"), "default_top_p", 0.9),
    (("--stream-interval", "2"), "stream_interval", 2),
    (("--max-queue", "3"), "max_queue", 3),
    (("--max-connections", "7"), "max_connections", 7),
    (("--allowed-hosts", "a.example, b.example"), "allowed_hosts", ("a.example", "b.example")),
    (("--cors-origins", "https://app.example"), "cors_origins", ("https://app.example",)),
    (("--rate-limit", "5"), "rate_limit", 5),
    (("--enable-metrics",), "enable_metrics", True),
    (("--blas", "openblas"), "blas", "openblas"),
    (("--threads", "2"), "threads", 2),
    (("--continuous-batching",), "continuous_batching", True),
    (("--no-continuous-batching",), "continuous_batching", False),
    (("--max-num-seqs", "4"), "max_num_seqs", 4),
    (("--prefill-step-size", "64"), "prefill_step_size", 64),
    (("--cache-memory-mb", "0"), "cache_memory_mb", 0),
    (("--cache-memory-percent", "0.5"), "cache_memory_percent", 0.5),
    (("--max-kv-memory-mb", "0.5"), "max_kv_memory_mb", 0.5),
    (("--use-paged-cache",), "use_paged_cache", True),
    (("--no-use-paged-cache",), "use_paged_cache", False),
    (("--cache-disk-dir", "/tmp/kv"), "cache_disk", CacheDiskConfig(dir="/tmp/kv")),
    (("--cache-disk-budget-gb", "3"), "cache_disk", CacheDiskConfig(budget_gb=3)),
    (("--kv-bits", "4"), "kv_bits", 4),
    (("--kv-group-size", "32"), "kv_group_size", 32),
    (("--enable-auto-tool-choice",), "enable_auto_tool_choice", True),
    (("--no-enable-auto-tool-choice",), "enable_auto_tool_choice", False),
    (("--tool-call-parser", "hermes"), "tool_call_parser", "hermes"),
    (("--reasoning-parser", "qwen3"), "reasoning_parser", "qwen3"),
    (("--strict-model-name",), "strict_model_name", True),
    (("--embedding-model", "builtin:all-minilm-l6-v2"), "embedding_model", "builtin:all-minilm-l6-v2"),
    (("--max-images", "2"), "max_images", 2),
    (("--max-image-mb", "1.5"), "max_image_mb", 1.5),
    (("--max-image-pixels", "100"), "max_image_pixels", 100),
    (("--max-request-image-pixels", "200"), "max_request_image_pixels", 200),
    (("--image-pixel-budget", "300"), "image_pixel_budget", 300),
    (("--allow-image-urls",), "allow_image_urls", True),
    (("--allowed-image-hosts", "a", "b"), "allowed_image_hosts", ("a", "b")),
    (("--image-url-timeout", "2"), "image_url_timeout", 2.0),
    (("--speculative", "prompt-lookup"), "speculative", SpeculativeConfig()),
    (("--speculative", "off"), "speculative", None),
    (
        ("--speculative", "draft", "--draft-model", "builtin:tiny"),
        "speculative",
        SpeculativeConfig(method="draft", draft_model="builtin:tiny"),
    ),
    (("--num-draft", "8"), "speculative", SpeculativeConfig(num_draft=8)),
    (("--ngram", "3"), "speculative", SpeculativeConfig(ngram=3)),
    (("--no-adaptive-speculation",), "speculative", SpeculativeConfig(adaptive=False)),
]


def test_every_flag_taken_before_the_schema_made_them_is_still_taken():
    parser = _serve_parser(argparse.ArgumentParser().add_subparsers())
    taken = {name for action in parser._actions for name in action.option_strings}
    assert set(FLAGS_BEFORE_THE_SCHEMA) <= taken
    given = {flag for flags, _, _ in MEANINGS for flag in flags if flag.startswith("--")}
    own = {"--api-key", "--api-key-file", "--state-dir", "--log-level", "--health-socket", "--mcp-config"}
    assert set(FLAGS_BEFORE_THE_SCHEMA) - given == own  # those are checked by the tests below


@pytest.mark.parametrize("flags, key, value", MEANINGS, ids=[" ".join(m[0]) for m in MEANINGS])
def test_each_flag_sets_what_it_set(flags, key, value):
    assert getattr(serve_config(parse("builtin:tiny", *flags)), key) == value


def test_the_flags_of_the_command_itself(tmp_path):
    args = parse("builtin:tiny", "--state-dir", "/tmp/s", "--log-level", "debug", "--health-socket", "/tmp/h.sock")
    assert (args.state_dir, args.log_level, args.health_socket) == ("/tmp/s", "debug", "/tmp/h.sock")
    sub = argparse.ArgumentParser().add_subparsers()
    parser = _serve_parser(sub)
    args = parser.parse_args(["builtin:tiny", "--api-key", "sk-flag"])
    args.api_key = _api_key(args, parser)
    assert serve_config(args).api_key.get_secret_value() == DIGEST_PREFIX + key_digest("sk-flag")
    mcp = tmp_path / "mcp.json"
    mcp.write_text('{"mcpServers": {"fs": {"command": "echo"}}}')
    config = serve_config(parse("builtin:tiny", "--mcp-config", str(mcp)))
    assert config.mcp_config == str(mcp) and list(config.mcp_servers_resolved) == ["fs"]


def test_a_rate_is_a_count_or_text_and_new_keys_are_flags_too():
    assert serve_config(parse("builtin:tiny", "--rate-limit", "120/minute")).rate_limit == "120/minute"
    config = serve_config(
        parse("builtin:tiny", "--trusted-proxies", "10.0.0.0/8", "--cache-scope", "entry", "--max-body-mb", "2")
    )
    assert (config.trusted_proxies, config.cache_scope, config.max_body_mb) == (("10.0.0.0/8",), "entry", 2.0)


def test_a_section_key_refused_names_its_own_flag():
    with pytest.raises(ValidationError) as info:
        serve_config(parse("builtin:tiny", "--cache-disk-budget-gb", "0", "--num-draft", "0"))
    assert describe_flag_errors(info.value) == (
        "--cache-disk-budget-gb: Input should be greater than 0; --num-draft: Input should be greater than or equal to 1"
    )
