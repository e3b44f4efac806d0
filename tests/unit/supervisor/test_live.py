"""push_settings when the worker is gone: a reason, never an exception. (The real exchange is
tests/integration/test_live_settings.py, against a real worker.)"""

from __future__ import annotations

import asyncio

from pydantic import SecretStr

from vllmmlxd.config.schema import ModelConfig
from vllmmlxd.supervisor.live import push_settings


def test_no_worker_on_the_socket_is_a_reason_without_the_key(tmp_path):
    config = ModelConfig(model="builtin:tiny", api_key=SecretStr("s3cret-never-shown"))
    ok, reason = asyncio.run(push_settings(tmp_path / "gone.sock", config, timeout=1))
    assert not ok and "did not answer" in reason and "s3cret" not in reason
