"""The supervisor's timings, with overrides from the environment read here and nowhere else.

The defaults suit real models; the overrides exist so tests (and people debugging a
supervisor) can make health checks, start timeouts and backoff fast:

  VLLMMLXD_HEALTH_INTERVAL_S   seconds between health checks of a ready worker (10)
  VLLMMLXD_HEALTH_FAILURES     failed or "degraded" checks in a row that get it killed and restarted (3)
  VLLMMLXD_HEALTH_TIMEOUT_S    seconds one health check may take (5)
  VLLMMLXD_READY_TIMEOUT_S     seconds a worker may take to become ready (900: a first use may convert a model)
  VLLMMLXD_BACKOFF_INITIAL_S   first restart delay after a crash (0.5), doubling up to VLLMMLXD_BACKOFF_MAX_S (30)
  VLLMMLXD_FAST_CRASH_S        a crash this soon after READY (or before it) is a fast crash (10)
  VLLMMLXD_MAX_FAST_CRASHES    fast crashes in a row that mark the model failed (5)
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .backoff import BackoffPolicy


@dataclass(frozen=True)
class Tuning:
    health_interval_s: float = 10.0
    health_failures: int = 3
    health_timeout_s: float = 5.0
    ready_timeout_s: float = 900.0
    policy: BackoffPolicy = field(default_factory=BackoffPolicy)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Tuning:
        def num(name: str, default: float, cast: Callable[[str], float] = float) -> Any:
            raw = env.get(name)
            return cast(raw) if raw not in (None, "") else default

        base, policy = cls(), BackoffPolicy()
        return cls(
            health_interval_s=num("VLLMMLXD_HEALTH_INTERVAL_S", base.health_interval_s),
            health_failures=num("VLLMMLXD_HEALTH_FAILURES", base.health_failures, int),
            health_timeout_s=num("VLLMMLXD_HEALTH_TIMEOUT_S", base.health_timeout_s),
            ready_timeout_s=num("VLLMMLXD_READY_TIMEOUT_S", base.ready_timeout_s),
            policy=BackoffPolicy(
                initial_s=num("VLLMMLXD_BACKOFF_INITIAL_S", policy.initial_s),
                max_s=num("VLLMMLXD_BACKOFF_MAX_S", policy.max_s),
                fast_crash_s=num("VLLMMLXD_FAST_CRASH_S", policy.fast_crash_s),
                max_fast_crashes=num("VLLMMLXD_MAX_FAST_CRASHES", policy.max_fast_crashes, int),
            ),
        )
