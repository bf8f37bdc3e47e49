"""Analysis: read-only SQL over a store's views (`artstore sql`).

`query(store, sql)` returns every row; `stream_query(store, sql)` hands them over as the
database sends them.
"""

from artstore.analysis.sql import QueryResult, QueryRows, query, stream_query

__all__ = ["QueryResult", "QueryRows", "query", "stream_query"]
