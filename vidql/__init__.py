"""vidql: proxy-accelerated visual analytics queries over video, with guarantees."""
from vidql.engine.errors import (CatalogError, OracleError, ParameterError, QueryError,
                                 VideoError, VidqlError)
from vidql.api import contains, objects
from vidql.database import Database, connect

__all__ = ["connect", "Database", "objects", "contains", "VidqlError", "VideoError", "QueryError", "CatalogError",
           "OracleError", "ParameterError"]
