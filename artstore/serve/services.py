"""What the handlers of `artstore serve` share: the store, its rollouts, access, the proxy."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from artstore.serve.access import Access
    from artstore.serve.proxy import Proxy
    from artstore.serve.rollouts import Rollouts
    from artstore.store import Store


@dataclass
class Services:
    store: Store
    rollouts: Rollouts
    access: Access
    proxy: Proxy
    max_body_bytes: int
    runs_started: dict[str, Any] = field(default_factory=dict)  # read once per run
