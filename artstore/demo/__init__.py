"""`artstore demo`: a complete small training run, offline, in seconds.

A LangGraph agent with two tools (`artstore.demo.task`) answers questions against the
local inference server (`artstore.testing.inference_server`), its answers are rewarded,
and `CheckOnlyBackend` "trains" on them (it checks the groups and advances the step like
ART's LocalBackend, without a GPU). Everything is recorded in the store, so the run can
then be looked at, re-scored and replayed like any other.
"""

from artstore.demo.run import DemoResult, run_demo
from artstore.demo.task import agent, demo_policy, make_scenarios, reward, strict_reward

__all__ = [
    "DemoResult",
    "agent",
    "demo_policy",
    "make_scenarios",
    "reward",
    "run_demo",
    "strict_reward",
]
