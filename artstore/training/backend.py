"""The recording backend: any `art.Backend`, with every `train` call recorded as a train step.

    backend = artstore.recording_backend(store, LocalBackend(), run="my-run")  # an art.Backend
    await model.register(backend)
    result = await backend.train(model, groups, learning_rate=1e-5)

Everything is delegated to the wrapped backend: attributes, methods, `isinstance` checks
(`isinstance(backend, LocalBackend)` holds) and the class-level capability checks ART
makes (`hasattr(type(backend), "adapter_lease")`). What it adds, per `train` call:

1. groups artstore has never seen are recorded first (`record_group`), with the
   trajectories' rewards under the run's scorer; groups that came from artstore are
   recognised by their `artstore_group_id` (a changed reward is recorded again);
2. a group the model has already been trained on refuses the call before anything is
   trained (GroupAlreadyConsumedError): no group is trained twice into one model;
3. the step is recorded as TrainingFramework records its own: `train_step.started`, the
   wrapped backend's `train`, then `train_step.completed` consuming the groups in one
   transaction (or `train_step.failed`, and the backend's exception as it was).

Registering a model settles a step a crash left open, with the backend's own step
(`model.get_step()`): recorded as trained if the backend finished it, as failed (its
groups unconsumed again) if not. The first `train` takes the model (one trainer per model:
a second process gets TrainerConflictError) and settles again. Close the backend (or use
`async with`) to release the model; a process that dies releases it by itself.
"""

from __future__ import annotations

import inspect
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING, Any

from artstore.arguments import check_name, check_store
from artstore.art_versions import model_key
from artstore.errors import GroupAlreadyConsumedError, TrainerConflictError
from artstore.training.lease import trainer_lease
from artstore.training.recording import record_group
from artstore.training.runs import ensure_run
from artstore.training.steps import consumed_groups, reconcile, record_step

if TYPE_CHECKING:
    import art

    from artstore.store import Store

_OWN = frozenset({"_inner", "_store", "_run", "_scorer", "_leases", "_settled"})


class RecordingBackend:
    """An `art.Backend` that records the train steps of the backend it wraps."""

    def __init__(self, store: Store, backend: Any, *, run: str, scorer: str | None) -> None:
        object.__setattr__(self, "_inner", backend)
        object.__setattr__(self, "_store", store)
        object.__setattr__(self, "_run", run)
        object.__setattr__(self, "_scorer", scorer)
        object.__setattr__(self, "_leases", AsyncExitStack())
        object.__setattr__(self, "_settled", set())

    # --- being the wrapped backend ------------------------------------------------------

    @property  # isinstance(backend, LocalBackend) holds, as it would unwrapped
    def __class__(self) -> type:  # type: ignore[override]
        return type(self._inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)

    def __repr__(self) -> str:
        return f"<recording {self._inner!r} for run {self._run!r}>"

    @property
    def unrecorded(self) -> Any:
        """The wrapped backend (what artstore's own loop trains with: it records itself)."""
        return self._inner

    async def __aenter__(self) -> RecordingBackend:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the models this backend trains, then close the wrapped backend."""
        try:
            await self.release()
        finally:
            await self._inner.close()

    async def release(self) -> None:
        """Release the models this backend trains (another process may train them now);
        the wrapped backend stays open."""
        try:
            await self._leases.aclose()
        finally:
            object.__setattr__(self, "_leases", AsyncExitStack())
            self._settled.clear()

    # --- recording ------------------------------------------------------------------------

    async def register(self, model: art.Model, *args: Any, **kwargs: Any) -> None:
        """The wrapped backend's `register`; then a train step a crash left open is settled.

        Settled here, not only at the first `train`: a crash inside the last step's
        `backend.train` leaves a loop (`range(await model.get_step(), num_steps)`) nothing
        to train when it starts again, and the step would stay open, its groups
        unconsumed. The model is taken only for that moment: while another process trains
        it, that trainer settles the step, and this one learns of it at its first `train`.
        """
        await self._inner.register(model, *args, **kwargs)
        if not getattr(model, "trainable", False) or model_key(model) in self._settled:
            return
        try:
            async with trainer_lease(self._store.database, self._run, model_key(model)):
                await reconcile(self._store, model)
        except TrainerConflictError:
            return

    async def settle(self, model: art.TrainableModel) -> None:
        """Take `model` for this process and settle a step a crash left open (once)."""
        key = model_key(model)
        if key in self._settled:
            return
        await self._leases.enter_async_context(trainer_lease(self._store.database, self._run, key))
        self._settled.add(key)
        await reconcile(self._store, model)

    async def train(
        self, model: art.TrainableModel, trajectory_groups: Any, **kwargs: Any
    ) -> art.TrainResult:
        """The wrapped backend's `train`, recorded as a train step of the run."""
        groups = list(trajectory_groups)
        # Arguments the backend refuses fail here, before anything is recorded.
        inspect.signature(self._inner.train).bind(model, groups, **kwargs)
        await self.settle(model)
        scorer = await ensure_run(self._store, self._run, model=model, scorer=self._scorer)
        group_ids = [
            await record_group(self._store, group, run=self._run, model=model, scorer=scorer)
            for group in groups
        ]
        twice = {g for g in group_ids if group_ids.count(g) > 1}
        consumed = await consumed_groups(self._store, model, group_ids)
        if twice or consumed:
            group_id = sorted(twice or consumed)[0]
            raise GroupAlreadyConsumedError(
                f"group {group_id} of run {self._run!r} "
                + (
                    "is given twice to this train call"
                    if twice
                    else f"was already trained into {model_key(model)}"
                )
                + "; nothing was trained (artstore.unconsumed_groups(store, run, model) gives the "
                "groups left to train)"
            )
        return await record_step(
            self._store,
            run=self._run,
            model=model,
            group_ids=group_ids,
            scorer=scorer,
            train=lambda: self._inner.train(model, groups, **kwargs),
        )


class _Forward:
    """A class attribute of the wrapped backend's class, read from the wrapped backend."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, instance: Any, owner: type | None = None) -> Any:
        if instance is None:
            return self
        return getattr(instance._inner, self.name)

    def __set__(self, instance: Any, value: Any) -> None:
        setattr(instance._inner, self.name, value)


_CLASSES: dict[type, type] = {}


def _recording_class(backend_class: type) -> type:
    """RecordingBackend, with the wrapped class's attributes on the class too.

    ART checks some capabilities on the class (`hasattr(type(backend), "adapter_lease")`
    in PipelineTrainer): they must hold for the wrapper exactly when they hold for the
    backend it wraps.
    """
    if backend_class not in _CLASSES:
        own = set(dir(RecordingBackend))
        namespace = {
            name: _Forward(name)
            for name in dir(backend_class)
            if name not in own and not name.startswith("__")
        }
        _CLASSES[backend_class] = type(
            f"Recording{backend_class.__name__}", (RecordingBackend,), namespace
        )
    return _CLASSES[backend_class]


def recording_backend(
    store: Store, backend: Any, *, run: str, scorer: str | None = None
) -> RecordingBackend:
    """`backend` (any `art.Backend`) with its train steps recorded under `run`.

    `scorer`: the name the rewards of groups recorded at training time go under
    (default: the run's scorer, `reward` for a new run).
    """
    check_store(store)
    check_name("run", run)
    check_name("scorer", scorer, optional=True)
    if issubclass(type(backend), RecordingBackend):  # `type`, not `__class__`: the wrapper
        backend = backend.unrecorded  # wrapped again: recorded under the new run only
    return _recording_class(type(backend))(store, backend, run=run, scorer=scorer)


def recording_backend_of(model: Any) -> RecordingBackend | None:
    """The recording backend `model` is registered with, if it is."""
    backend = getattr(model, "_backend", None)
    return backend if issubclass(type(backend), RecordingBackend) else None
