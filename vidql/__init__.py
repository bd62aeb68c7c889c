"""vidql: proxy-accelerated visual analytics queries over video, with guarantees."""
from vidql.engine.errors import (CatalogError, OracleError, ParameterError, QueryError,
                                 VideoError, VidqlError)

__all__ = ["VidqlError", "VideoError", "QueryError", "CatalogError", "OracleError",
           "ParameterError"]
