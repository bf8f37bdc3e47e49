"""Rollout workers on many hosts, coordinated through PostgreSQL.

- `claims`: the run's work as claimable rows, leases with heartbeats, fencing checks;
- `notify`: waking up on the run's notifications (LISTEN/NOTIFY);
- `arrivals`: waiting for sealed groups (`wait_for_groups`, `sealed_groups`), for any
  trainer, a user's own loop included;
- `worker`: the worker process's loop (`run_worker`, `artstore worker`).

The trainer's side (`TrainingConfig(rollouts="workers")`) is in
`artstore.training.from_workers`.
"""

from artstore.workers.arrivals import sealed_groups, unconsumed_groups, wait_for_groups
from artstore.workers.worker import WorkerSummary, run_worker

__all__ = ["WorkerSummary", "run_worker", "sealed_groups", "unconsumed_groups", "wait_for_groups"]
