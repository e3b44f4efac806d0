"""transformers' import table memoized across worker starts (vllmmlxd/runtime/import_memo.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from vllmmlxd.runtime import import_memo


def _table() -> dict:
    return {
        frozenset(): {"bert.configuration_bert": {"BertConfig"}},
        frozenset({"torch"}): {"bert.modeling_bert": {"BertModel"}},
    }


def test_a_table_is_built_once_then_read_back_fresh_each_call(tmp_path):
    calls = []

    def real(module_path, prefix=None):
        calls.append((module_path, prefix))
        return _table()

    path = tmp_path / "memo.json"
    first = import_memo.memoized(real, path)("/x/models", "models")
    assert first == _table() and len(calls) == 1
    first[frozenset()]["mutated"] = {"X"}  # transformers mutates what it gets

    again = import_memo.memoized(real, path)  # the next process
    assert again("/x/models", "models") == _table()
    assert again("/x/models", "models") == _table()
    assert len(calls) == 1
    again("/x/models/bert", None)  # another key is built, and kept beside the first
    assert len(calls) == 2 and len(json.loads(path.read_text())) == 2


def test_a_damaged_memo_falls_back_to_building_the_table(tmp_path):
    path = tmp_path / "memo.json"
    path.write_text("{not json")
    assert import_memo.memoized(lambda p, prefix=None: _table(), path)("/m") == _table()
    path.write_text(json.dumps({"/m|None": [[1, 2]]}))  # readable, but not a table
    assert import_memo.memoized(lambda p, prefix=None: _table(), path)("/m") == _table()


def test_a_fresh_interpreter_reads_transformers_table_from_the_memo(tmp_path):
    script = textwrap.dedent(
        """
        import json, sys
        from pathlib import Path
        from vllmmlxd.runtime import import_memo
        assert import_memo.install(Path(sys.argv[1]))
        import transformers
        transformers.AutoTokenizer  # resolves through the lazy table
        print(json.dumps("PlantedByTheTest" in dir(transformers)))
        """
    )
    run = lambda: subprocess.run(  # noqa: E731
        [sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(run().stdout.splitlines()[-1]) is False
    (memo,) = tmp_path.glob("transformers-imports-*.json")
    data = json.loads(memo.read_text())
    key = next(k for k in data if k.endswith("|models"))
    no_backend = next(modules for backends, modules in data[key] if backends == [])
    no_backend["models.bert.planted"] = ["PlantedByTheTest"]
    memo.write_text(json.dumps(data))
    # The second start's table is the memo's: what was planted in it shows.
    assert json.loads(run().stdout.splitlines()[-1]) is True


def test_the_key_follows_the_install(tmp_path):
    pkg = tmp_path / "transformers"
    (pkg / "models").mkdir(parents=True)
    (pkg / "utils").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "utils" / "import_utils.py").write_text("")
    before = import_memo.install_key(pkg)
    (pkg / "utils" / "import_utils.py").write_text("# upgraded")
    assert import_memo.install_key(pkg) != before
    assert import_memo.install_key(Path(pkg)) == import_memo.install_key(pkg)
