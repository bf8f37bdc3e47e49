"""The database schema: tables (SQLAlchemy Core), migrations (Alembic) and SQL views."""
