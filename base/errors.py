"""Errors a user can cause. Each message says what is wrong and what to do about it.

This module imports nothing: every layer of vidql may raise these. Each error is also the
built-in exception its kind of failure is (a bad value a ValueError, an unknown name a
LookupError, an unreadable video an OSError), so generic handlers catch them too."""


class VidqlError(Exception):
    """Base class of every error a user can cause (bad input, bad query, bad parameter)."""


class VideoError(VidqlError, OSError):
    """A video file that is missing, unreadable, corrupt or unsupported."""

    def __init__(self, path, reason: str):
        self.path = str(path)
        self.reason = reason
        super().__init__(f"cannot read video '{self.path}': {reason}")


class QueryError(VidqlError):
    """A malformed query; carries the character position and an optional hint."""

    def __init__(self, message: str, query: str | None = None, position: int | None = None,
                 hint: str | None = None):
        self.query = query
        self.position = position
        self.hint = hint
        text = message
        if position is not None:
            text += f" (at position {position})"
            if query is not None:
                line_start = query.rfind("\n", 0, position) + 1
                line_end = query.find("\n", position)
                line = query[line_start:line_end if line_end >= 0 else len(query)]
                text += f"\n  {line}\n  {' ' * (position - line_start)}^"
        if hint:
            text += f"\nhint: {hint}"
        super().__init__(text)


class CatalogError(VidqlError, LookupError):
    """An unknown or duplicate name in the catalog (video, oracle, index)."""


class OracleError(VidqlError):
    """An oracle that cannot be created or that failed while labelling."""


class ParameterError(VidqlError, ValueError):
    """A parameter outside its allowed range."""


class DiskFullError(VidqlError, OSError):
    """The disk holding the database or its label journal is full."""
