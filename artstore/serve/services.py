"""What the handlers of `artstore serve` share: the store, its rollouts, access, the proxy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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
