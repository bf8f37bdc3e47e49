"""The cyclic collector paused while trajectories are built, and its state given back."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest
from langchain_core.messages import AIMessage, HumanMessage

from artstore.collector import collector_paused
from artstore.testing.inference_server import token_logprobs


@pytest.fixture
def collector_enabled() -> Iterator[None]:
    """Each test starts with the collector on, and leaves it as the session had it."""
    was = gc.isenabled()
    gc.enable()
    yield
    (gc.enable if was else gc.disable)()


def test_paused_inside_and_enabled_after(collector_enabled) -> None:
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():  # nested: still paused, and not resumed by the inner exit
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_enabled_again_after_an_exception(collector_enabled) -> None:
    with pytest.raises(ValueError), collector_paused():
        raise ValueError("a build that fails")
    assert gc.isenabled()


def test_a_collector_disabled_before_stays_disabled(collector_enabled) -> None:
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_overlapping_threads_resume_it_once_the_last_is_done(collector_enabled) -> None:
    inside, release = threading.Barrier(2), threading.Event()

    def build() -> None:
        with collector_paused():
            inside.wait()
            release.wait()

    worker = threading.Thread(target=build)
    worker.start()
    with collector_paused():
        inside.wait()  # both inside
    assert not gc.isenabled()  # the worker's build is still running
    release.set()
    worker.join()
    assert gc.isenabled()


async def test_store_trajectories_gives_the_collector_back(store, collector_enabled) -> None:
    text = "the answer"
    metadata = {
        "logprobs": {"content": token_logprobs(text), "refusal": None},
        "finish_reason": "stop",
        "model_name": "test-model",
    }
    async with store.rollout("my-model") as rollout:
        rollout.record_llm_call([HumanMessage("q")], AIMessage(text, response_metadata=metadata))
    trajectory = await store.trajectory(rollout.id)
    assert trajectory.messages_and_choices[-1].logprobs.content[0].token == "the"
    assert gc.isenabled()
    gc.disable()
    await store.trajectories([rollout.id])
    assert not gc.isenabled()


async def test_the_writer_pauses_it_for_a_batch_and_gives_it_back(store, collector_enabled) -> None:
    from artstore.events import RunFinished

    seen: list[bool] = []

    def condition(connection) -> None:  # runs inside the batch's transaction
        seen.append(gc.isenabled())

    futures = [
        store.append_nowait(f"run-{n}", [RunFinished(run=str(n))], condition=condition)
        for n in range(3)
    ]
    for future in futures:
        await future
    assert seen == [False, False, False]
    assert gc.isenabled()
