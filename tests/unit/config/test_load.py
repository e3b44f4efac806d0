"""load.py: positions of every kind of error, secrets, and what errors never show."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from vllmmlxd.config.load import LoadedConfig, load_config, parse_config
from vllmmlxd.config.schema import Config
from vllmmlxd.errors import ConfigError

SECRET = "sk-do-not-print-me-4242"


def error_of(text: str, path: str = "c.yaml") -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(text, path)
    return str(info.value)


def test_valid_config_loads_with_hash():
    text = "models:\n  llama:\n    model: builtin:tiny\n    port: 8001\n"
    loaded = parse_config(text, "c.yaml")
    assert isinstance(loaded, LoadedConfig)
    assert loaded.config.models["llama"].port == 8001
    assert loaded.path == "c.yaml"
    assert loaded.text_hash == hashlib.sha256(text.encode()).hexdigest()
    assert loaded.short_hash == loaded.text_hash[:12]


@pytest.mark.parametrize("text", ["", "# only a comment\n", "daemon:\nmodels:\n"])
def test_empty_file_and_empty_sections_are_a_config_with_no_models(text):
    assert parse_config(text).config == Config()


def test_load_config_reads_a_file_and_hashes_its_bytes(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_bytes(b"models:\n  a:\n    model: builtin:tiny\n")
    loaded = load_config(p)
    assert loaded.path == str(p)
    assert loaded.text_hash == hashlib.sha256(p.read_bytes()).hexdigest()


def test_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"nope\.yaml: no such file$"):
        load_config(p)


def test_unknown_key_has_position_and_hint_from_model_config():
    text = "models:\n  llama:\n    model: x\n    prot: 8001\n"
    assert error_of(text) == "c.yaml:4:5: models.llama.prot: unknown key; did you mean 'port'?"


def test_unknown_key_hints_use_the_right_model():
    assert (
        error_of("daemon:\n  loglevel: info\n") == "c.yaml:2:3: daemon.loglevel: unknown key; did you mean 'log_level'?"
    )
    assert error_of("modles: {}\n") == "c.yaml:1:1: modles: unknown key; did you mean 'models'?"
    # No close match: list what is allowed instead.
    assert (
        error_of("zzz: 1\n")
        == "c.yaml:1:1: zzz: unknown key; expected one of: daemon, mcp_config, mcp_servers, api_keys, gateway, models"
    )


def test_every_error_is_listed_with_the_value_position():
    text = "daemon:\n  log_level: loud\nmodels:\n  llama:\n    model: x\n    port: eighty\n    aliases: [ok, 1]\n"
    lines = error_of(text).splitlines()
    assert lines == [
        "c.yaml:2:14: daemon.log_level: Input should be 'debug', 'info', 'warning' or 'error'",
        "c.yaml:6:11: models.llama.port: Input should be a valid integer, unable to parse string as an integer",
        "c.yaml:7:19: models.llama.aliases[1]: Input should be a valid string",
    ]


def test_bad_nested_value_out_of_range():
    text = "models:\n  llama:\n    model: x\n    default_temperature: 3\n"
    assert error_of(text).startswith("c.yaml:4:26: models.llama.default_temperature: Input should be less than")


def test_missing_field_points_at_its_entry():
    assert error_of("models:\n  llama:\n    port: 8001\n") == (
        "c.yaml:2:3: models.llama: give model (served here) or upstream (served by another host), one of the two"
    )


def test_entry_validator_points_at_its_entry():
    text = "models:\n  a:\n    model: x\n    max_tokens: 10\n    max_request_tokens: 5\n"
    assert error_of(text) == (
        "c.yaml:2:3: models.a: max_tokens (10), the default, is larger than max_request_tokens (5), "
        "the cap: lower max_tokens or leave it out"
    )


def test_duplicate_key_names_both_lines():
    text = "models:\n  llama:\n    model: x\n    port: 1\n    port: 2\n"
    assert error_of(text) == "c.yaml:5:5: models.llama.port: duplicate key, first defined at line 4, column 5"


def test_duplicate_model_entry():
    text = "models:\n  a:\n    model: x\n  a:\n    model: y\n"
    assert error_of(text) == "c.yaml:4:3: models.a: duplicate key, first defined at line 2, column 3"


def test_yaml_syntax_error_uses_the_problem_mark():
    text = "models:\n  llama:\n    model: x\n   port: 1\n"
    msg = error_of(text)
    assert msg.startswith("c.yaml:4:4: invalid YAML: ")
    assert "line 2" in msg


def test_unknown_yaml_tag_is_a_config_error():
    assert error_of("models: !foo x\n").startswith("c.yaml:1:9: invalid YAML: could not determine a constructor")


def test_top_level_must_be_a_mapping():
    assert error_of("- 1\n") == "c.yaml:1:1: the top level must be a mapping of 'daemon' and 'models'"


def test_duplicate_host_port_points_at_the_second_entry():
    text = "models:\n  a:\n    model: x\n  b:\n    model: y\n    port: 8000\n"
    assert error_of(text) == "c.yaml:4:3: models.b: models 'a' and 'b' both listen on 127.0.0.1:8000"


def test_bad_model_name_points_at_its_key():
    text = "models:\n  ok:\n    model: x\n  'bad name':\n    model: y\n    port: 9\n"
    assert error_of(text) == (
        "c.yaml:4:3: models.bad name: model name 'bad name' must be letters, digits, '_', '.' or '-'"
    )


def test_keys_stay_strings_as_written():
    loaded = parse_config("models:\n  8001:\n    model: x\n")
    assert list(loaded.config.models) == ["8001"]


def test_merge_keys_work_and_explicit_keys_win():
    text = "models:\n  a: &base {model: x, port: 1}\n  b:\n    <<: *base\n    port: 2\n"
    models = parse_config(text).config.models
    assert (models["b"].model, models["b"].port) == ("x", 2)


def test_state_dir_and_control_socket_expand_tilde():
    daemon = parse_config("daemon:\n  state_dir: ~/st\n  control_socket: ~/st/c.sock\n").config.daemon
    assert daemon.state_dir == Path.home() / "st"
    assert daemon.control_socket == Path.home() / "st" / "c.sock"


# --- secrets ---------------------------------------------------------------------------------


def held(key: str) -> str:
    """What the config keeps of an api_key: its digest."""
    return "sha256:" + hashlib.sha256(key.encode()).hexdigest()


def test_env_secret_is_substituted(monkeypatch):
    monkeypatch.setenv("VLLMMLXD_TEST_KEY", SECRET)
    config = parse_config("models:\n  a:\n    model: x\n    api_key: ${env:VLLMMLXD_TEST_KEY}\n").config
    assert config.models["a"].api_key.get_secret_value() == held(SECRET)


def test_unset_env_var_is_an_error_with_position(monkeypatch):
    monkeypatch.delenv("VLLMMLXD_TEST_UNSET", raising=False)
    text = "models:\n  x:\n    model: m\n    api_key: ${env:VLLMMLXD_TEST_UNSET}\n"
    assert error_of(text) == "c.yaml:4:14: models.x.api_key: environment variable VLLMMLXD_TEST_UNSET is not set"


def test_file_secret_drops_one_trailing_newline(tmp_path):
    key = tmp_path / "key"
    key.write_text(SECRET + "\n\n")
    config = parse_config(f"models:\n  a:\n    model: x\n    api_key: ${{file:{key}}}\n").config
    assert config.models["a"].api_key.get_secret_value() == held(SECRET + "\n")


def test_file_secret_expands_tilde(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "key").write_text(SECRET + "\n")
    config = parse_config("models:\n  a:\n    model: x\n    api_key: ${file:~/key}\n").config
    assert config.models["a"].api_key.get_secret_value() == held(SECRET)


def test_relative_file_secret_is_relative_to_the_config(tmp_path):
    (tmp_path / "key").write_text(SECRET)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("models:\n  a:\n    model: x\n    api_key: ${file:key}\n")
    assert load_config(cfg).config.models["a"].api_key.get_secret_value() == held(SECRET)


def test_unreadable_file_secret_is_an_error(tmp_path):
    missing = tmp_path / "missing"
    msg = error_of(f"models:\n  a:\n    model: x\n    api_key: ${{file:{missing}}}\n")
    assert msg == f"c.yaml:4:14: models.a.api_key: cannot read secret file {missing}: No such file or directory"


def test_substitution_applies_to_whole_values_only(monkeypatch):
    monkeypatch.setenv("VLLMMLXD_TEST_KEY", SECRET)
    config = parse_config("models:\n  a:\n    model: x\n    owned_by: me-${env:VLLMMLXD_TEST_KEY}\n").config
    assert config.models["a"].owned_by == "me-${env:VLLMMLXD_TEST_KEY}"


def test_unknown_substitution_kind_is_an_error():
    msg = error_of("models:\n  a:\n    model: x\n    api_key: ${vault:k}\n")
    assert msg.startswith("c.yaml:4:14: models.a.api_key: unknown substitution")


def test_secrets_never_appear_in_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("VLLMMLXD_TEST_KEY", SECRET)
    (tmp_path / "key").write_text(SECRET)
    texts = [
        # A secret put where it is invalid, from the environment and from a file.
        "models:\n  a:\n    model: x\n    port: ${env:VLLMMLXD_TEST_KEY}\n",
        f"models:\n  a:\n    model: x\n    timeout: ${{file:{tmp_path / 'key'}}}\n",
        # A literal api_key of the wrong type, next to another error.
        f"models:\n  a:\n    model: x\n    api_key: [{SECRET}]\n    port: 0\n",
        f"models:\n  a:\n    model: x\n    api_key: {{k: {SECRET}}}\n",
        f"daemon:\n  log_level: {SECRET}\n",
    ]
    for text in texts:
        with pytest.raises(ConfigError) as info:
            parse_config(text)
        assert SECRET not in str(info.value)
        # The pydantic error (which shows input values) is not chained for tracebacks to print.
        assert info.value.__cause__ is None and info.value.__suppress_context__


def test_blas_takes_a_name_or_a_library_path():
    for value in ("auto", "mkl", "blis", "openblas", "bundled", "/opt/lib/libblis.so.4", "~/lib/libopenblas.so"):
        assert (
            parse_config(f"models:\n  a:\n    model: builtin:tiny\n    blas: {value}\n").config.models["a"].blas
            == value
        )
    msg = error_of("models:\n  a:\n    model: builtin:tiny\n    blas: fast\n")
    assert msg.startswith("c.yaml:4:11: models.a.blas:") and "auto, mkl, blis, openblas, bundled or a path" in msg
    assert "models.a.threads" in error_of("models:\n  a:\n    model: builtin:tiny\n    threads: 0\n")


def test_the_config_knows_every_reasoning_parser_and_no_other():
    from vllmmlxd.config.schema import REASONING_PARSERS
    from vllmmlxd.parsers.reasoning import REASONING_PARSERS as IMPLEMENTED

    assert set(REASONING_PARSERS) == set(IMPLEMENTED)
    assert (
        parse_config("models:\n  a:\n    model: builtin:tiny\n    reasoning_parser: qwen3\n")
        .config.models["a"]
        .reasoning_parser
        == "qwen3"
    )
    assert "qwen3, deepseek_r1" in error_of("models:\n  a:\n    model: builtin:tiny\n    reasoning_parser: gpt\n")


def test_the_config_knows_every_tool_call_parser_and_no_other():
    from vllmmlxd.config.schema import TOOL_PARSERS
    from vllmmlxd.parsers.tools import TOOL_PARSERS as IMPLEMENTED

    assert set(TOOL_PARSERS) == set(IMPLEMENTED)
    entry = parse_config("models:\n  a:\n    model: builtin:tiny\n").config.models["a"]
    assert entry.tool_call_parser == "auto" and entry.enable_auto_tool_choice is True
    assert (
        parse_config("models:\n  a:\n    model: builtin:tiny\n    tool_call_parser: mistral\n")
        .config.models["a"]
        .tool_call_parser
        == "mistral"
    )
    assert "auto, deepseek" in error_of("models:\n  a:\n    model: builtin:tiny\n    tool_call_parser: gpt\n")


def test_a_misspelt_model_key_is_named_at_its_place():
    # The entry is one of two kinds (model or upstream); a typo must still be pointed at, with the fix.
    lines = error_of("models:\n  llama:\n    modle: builtin:tiny\n").splitlines()
    assert "c.yaml:3:5: models.llama.modle: unknown key; did you mean 'model'?" in lines
