"""The errors artstore raises.

Callers catch these, never a database driver's exception: the event store maps driver
errors onto this small hierarchy (the way the `eventsourcing` library does), and every
message says what happened and what to do about it.
"""

from __future__ import annotations


class ArtstoreError(Exception):
    """Base class of every error artstore raises on purpose."""


class ConfigurationError(ArtstoreError, ValueError):
    """A setting, URL or argument is wrong before anything touched the database."""


class InvalidArgumentError(ConfigurationError, TypeError):
    """An argument of a public function has the wrong type or value; `argument` names it.

    Raised before anything is written. A TypeError too, as Python's own for a wrong type.
    """

    def __init__(self, argument: str, problem: str) -> None:
        self.argument = argument
        super().__init__(f"{argument} {problem}")


class DatabaseUnavailableError(ArtstoreError):
    """The database cannot be reached or opened, or cannot be used now (see below)."""


class LockTimeoutError(DatabaseUnavailableError):
    """A lock another session holds was waited for longer than the database allows."""


class PoolTimeoutError(DatabaseUnavailableError):
    """No connection of this process's pool came free in time: the database answered,
    this process had more work at once than connections (a pool configured with a
    deadline; artstore's own pools wait as long as it takes)."""


class StorageFullError(ArtstoreError):
    """The database has no space left for a write (its disk, or its size limit, is full)."""


class SchemaError(ArtstoreError):
    """The database schema does not match what this artstore expects."""


class SchemaTooNewError(SchemaError):
    """The database was migrated by a newer artstore than the one installed."""


class SchemaOutdatedError(SchemaError):
    """The database needs `artstore db upgrade` and automatic migration is off."""


class EventError(ArtstoreError):
    """An event is malformed, unknown or cannot be stored."""


class UnknownEventTypeError(EventError):
    """An event type that this artstore does not declare."""


class InvalidEventError(EventError, ValueError):
    """An event's payload does not validate or is not JSON."""


class AppendRefusedError(EventError):
    """The database refused an append (a value it cannot store, a constraint it enforces).

    Nothing of that append was written; appends batched with it are not affected.
    """


class WrongExpectedVersionError(ArtstoreError):
    """Optimistic concurrency conflict: the stream moved on since the caller read it.

    Nothing of the append was written; read the stream again and retry.
    """

    def __init__(
        self, stream_id: str, expected: int | None, actual: int, why: str | None = None
    ) -> None:
        self.stream_id = stream_id
        self.expected = expected
        self.actual = actual
        super().__init__(
            why
            or f"stream {stream_id!r} is at version {actual}, but the append expected "
            f"version {expected}; nothing was written (read the stream again and retry)"
        )


class DuplicateEventError(ArtstoreError):
    """Some, but not all, event ids of an append already exist: not a clean retry."""


class ImmutableEventError(ArtstoreError):
    """Something tried to change or delete a stored event or blob."""


class BlobReadError(ArtstoreError):
    """A blob stored in a compact form did not read back as the text its hash names."""


class GroupAlreadyConsumedError(ArtstoreError):
    """A trajectory group was already trained into this model (invariant 4)."""


class NotFoundError(ArtstoreError, LookupError):
    """A run, rollout or group that the store does not hold."""


class TrainerConflictError(ArtstoreError):
    """Another trainer holds the run."""


class RewardFunctionError(ArtstoreError):
    """A reward function raised or returned something unusable."""


class RolloutsFailedError(ArtstoreError):
    """Every policy rollout of a group failed; the run stops (resume rolls them out again)."""


class NoRolloutError(ArtstoreError, LookupError):
    """An LLM call or chat model that needs a rollout ran outside of any open rollout."""


class ReadOnlyStoreError(ArtstoreError):
    """The store was opened read-only (`open_store(url, read_only=True)`): it cannot record."""


class CallAbandonedError(ArtstoreError):
    """An LLM call was still waiting for its response when its rollout ended."""


class StoreClosedError(ArtstoreError):
    """The store was closed; open a new one."""


class QueryRefusedError(ArtstoreError, ValueError):
    """An analysis query tried to change the database, or held more than one statement."""


class QueryError(ArtstoreError):
    """The database could not run an analysis query (a syntax error, an unknown column...)."""


class ResultTooLargeError(QueryError):
    """An analysis query's rows went past the bytes a query may hand over (the rows before
    were handed over)."""


class ExchangeFormatError(ArtstoreError, ValueError):
    """A file given to `artstore import` is not in a format artstore reads (nothing imported)."""


class ExportTargetError(ArtstoreError):
    """An export cannot write where it was told to: not a regular file there (a link, a
    pipe, a device...), or the system refused the write (no space left...). Nothing of
    that file was written."""


class ImportConflictError(ArtstoreError):
    """An import would write rollouts or groups the store already holds from elsewhere."""


class ArtVersionError(ArtstoreError):
    """The installed ART cannot represent something the store holds (a newer ART can)."""


class LeaseLostError(ArtstoreError):
    """A worker's claim expired or was taken over: the database refused its write (fencing)."""


class WrongDatabaseError(ConfigurationError):
    """A worker and the run's trainer are not on the same database."""


class RolloutFailedBeforeError(ArtstoreError):
    """A durable rollout stands for one that failed in a group sealed before (a crash,
    then the loop ran again): the sealed group is final, so the failure is given again
    rather than the rollout done again (its redo would join a group already sealed)."""


class ArchiveError(ArtstoreError):
    """An archive that is missing, incomplete or not what its manifest says, or a run that
    cannot be archived or restored now (nothing was removed or restored)."""
