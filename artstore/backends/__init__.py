"""Backends for places without a GPU: `--backend artstore.backends:check_only_backend`."""

from __future__ import annotations

from typing import Any

from artstore.backends.check_only import (
    CHECKPOINT_FILE,
    NO_SERVER_BASE_URL,
    CheckOnlyBackend,
    TrajectoryCheckError,
    group_advantages,
)

__all__ = [
    "CHECKPOINT_FILE",
    "NO_SERVER_BASE_URL",
    "CheckOnlyBackend",
    "TrajectoryCheckError",
    "check_only_backend",
    "group_advantages",
]


def check_only_backend(**kwargs: Any) -> CheckOnlyBackend:
    """Factory for a CLI that imports `module:factory`; kwargs go to CheckOnlyBackend
    (path, inference_base_url, inference_api_key, push_dir)."""
    return CheckOnlyBackend(**kwargs)
