"""Alembic migrations of the artstore schema (shipped inside the package as artstore.migrations)."""
