"""vidql: proxy-accelerated visual analytics queries over video, with guarantees.

The errors load with the package; `connect`, `Database` and the builder functions load the
engine (DuckDB, pandas) when first used, so `import vidql.queries` stays light."""
from importlib import import_module

from vidql.base.errors import (CatalogError, OracleError, ParameterError, QueryError, VideoError,
                          VidqlError)

_LAZY = {"connect": "vidql.database", "Database": "vidql.database", "objects": "vidql.api",
         "contains": "vidql.api", "clip_in": "vidql.api", "IndexMismatchError": "vidql.indexes.tasti"}

__all__ = ["connect", "Database", "objects", "contains", "clip_in", "VidqlError", "VideoError", "QueryError",
           "CatalogError", "OracleError", "ParameterError", "IndexMismatchError"]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'vidql' has no attribute {name!r}")
    value = getattr(import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
