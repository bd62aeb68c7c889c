"""Statistical operators over proxy scores and oracle true values."""
from .aggregate import aggregate_error_bound, aggregate_ratio_error_bound
from .limit import limit_query
from .rare import find_rare
from .results import AggregateResult, RareResult, SelectionResult
from .stratified import aggregate_budget, aggregate_budget_grouped
from .supg import supg_precision, supg_recall

__all__ = [
    "AggregateResult", "SelectionResult", "RareResult",
    "aggregate_error_bound", "aggregate_ratio_error_bound",
    "aggregate_budget", "aggregate_budget_grouped",
    "limit_query", "supg_recall", "supg_precision", "find_rare",
]
