"""`artstore db`: schema migrations and maintenance."""

from __future__ import annotations

import typer

from artstore.cli.shared import UrlOption, console, err_console, run

app = typer.Typer(help="Schema migrations and maintenance.", no_args_is_help=True)


@app.command()
def upgrade(url: UrlOption = None) -> None:
    """Create the database or migrate it to this artstore's schema.

    On PostgreSQL, also confine the role artstore sql runs queries as to its functions
    (again: after CREATE EXTENSION, say); only a superuser may.
    """

    async def work() -> None:
        from artstore.eventstore.database import connect
        from artstore.eventstore.reader_role import READER_ROLE
        from artstore.store import prepare_schema
        from artstore.urls import resolve_url

        database = connect(resolve_url(url))
        try:
            await database.check_reachable()
            revision = await prepare_schema(database, upgrade=True)
            unconfined = await database.confine_reader()
        finally:
            await database.dispose()
        console.print(f"{database.display_url} is at schema revision {revision}")
        if unconfined:
            err_console.print(
                f"warning: artstore sql stays off here: {READER_ROLE} may still run "
                f"{unconfined[0]} and {len(unconfined) - 1} other functions outside artstore's "
                "allow-list, whose grants only a superuser may change (run artstore db "
                "upgrade as one)",
                highlight=False,
                soft_wrap=True,
            )

    run(work)


@app.command()
def current(url: UrlOption = None) -> None:
    """Print the database's schema revision (and this artstore's newest)."""

    async def work() -> None:
        from artstore.errors import NotFoundError
        from artstore.eventstore.database import connect
        from artstore.schema import migrate
        from artstore.urls import resolve_url

        try:  # read only: asking creates nothing
            database = connect(resolve_url(url, create_folder=False), read_only=True)
        except NotFoundError:
            revision = None
        else:
            try:
                await database.check_reachable()
                async with database.read() as connection:
                    revision = await connection.run_sync(migrate.current_revision)
            finally:
                await database.dispose()
        head = migrate.head_revision()
        state = "up to date" if revision == head else f"artstore's newest is {head}"
        console.print(f"{revision or 'empty (no schema)'} ({state})")

    run(work)


@app.command("rebuild-projections")
def rebuild_projections(url: UrlOption = None) -> None:
    """Recompute every read model (runs, rollouts, ... tables) from the event log."""

    async def work() -> None:
        import artstore

        async with await artstore.open_store(url, create=False) as store:  # none to rebuild
            count = await store.rebuild_projections()
        console.print(f"replayed {count} events into the projections")

    run(work)
