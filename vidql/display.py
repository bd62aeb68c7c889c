"""Showing a query's result on the terminal (shared by the command, the shell and the demo)."""
from __future__ import annotations


def print_result(result) -> None:
    """Print a Result as a readable table, followed by its report when it has one."""
    if result is None:
        return
    result.relation.show(max_width=160, max_rows=40)
    if result.report is not None:
        print(result.report.summary())
