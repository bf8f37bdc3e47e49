"""Analysis: read-only SQL over a store (`artstore sql`), on the views of
`artstore.schema.views` or any table."""

from artstore.analysis.sql import QueryResult, query

__all__ = ["QueryResult", "query"]
