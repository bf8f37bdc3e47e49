"""ART, imported on first use: the one module of artstore that imports `art` at runtime.

Importing ART costs seconds of CPU (LiteLLM, tokenizers, pydantic models by the hundred),
and much of artstore never needs it: `artstore --help`, `artstore runs`, reading a store.
So every other module reaches ART through the functions here, each of which imports what
it returns on its first call; `if TYPE_CHECKING: import art` for annotations is the only
other `import art` allowed, and the `art-behind-one-module` contract of import-linter
(pyproject.toml) refuses `import art` and `import litellm` anywhere else. What differs
between ART releases is decided in `art_versions`, which also goes through here.
"""

from __future__ import annotations

import importlib
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import art
    from art.trajectories import PydanticException, TrajectoryExchanges


@cache
def art_module(name: str = "") -> ModuleType:
    """ART's package `art`, or its module `art.<name>` (e.g. `"rewards.ruler"`)."""
    import art  # written out, not by name alone, so that import-linter sees who imports ART

    return importlib.import_module(f"art.{name}") if name else art


def trajectory_class() -> type[art.Trajectory]:
    """`art.Trajectory`."""
    return art_module().Trajectory


def trajectory_group_class() -> type[art.TrajectoryGroup]:
    """`art.TrajectoryGroup`."""
    return art_module().TrajectoryGroup


def model_class() -> type[art.Model]:
    """`art.Model`: a model that is served, not trained."""
    return art_module().Model


def trainable_model_class() -> type[art.TrainableModel]:
    """`art.TrainableModel`."""
    return art_module().TrainableModel


def trajectory_exchanges_class() -> type[TrajectoryExchanges]:
    """`art.trajectories.TrajectoryExchanges` (ART >= 0.5.20; `art_versions` says which)."""
    return art_module("trajectories").TrajectoryExchanges


def pydantic_exception_class() -> type[PydanticException]:
    """`art.trajectories.PydanticException`: an exception of a `TrajectoryGroup`, as data."""
    return art_module("trajectories").PydanticException


@cache
def local_backend_importable() -> bool:
    """Whether ART's `LocalBackend` can be imported here (it needs torch and transformers)."""
    try:
        art_module("local.backend")
    except ImportError:
        return False
    return True
