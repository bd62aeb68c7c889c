"""Statistical operators over proxy scores and oracle true values."""
from .aggregate import aggregate_error_bound, aggregate_ratio_error_bound
from .grouped import grouped_budget, grouped_error_bound, split_confidence
from .limit import limit_query
from .rare import RARE_BATCH, find_rare
from .results import AggregateResult, GroupedResult, RareResult, SelectionResult
from .budget import aggregate_budget
from .stratified import abae_budget, aggregate_budget_grouped
from .select_binomial import recall_adaptive, recall_binomial, recall_normal
from .select_forecast import selection_forecast
from .select_randomized import recall_randomized
from .supg import supg_precision

__all__ = [
    "AggregateResult", "GroupedResult", "SelectionResult", "RareResult",
    "aggregate_error_bound", "aggregate_ratio_error_bound",
    "grouped_error_bound", "grouped_budget", "split_confidence",
    "aggregate_budget", "abae_budget", "aggregate_budget_grouped",
    "limit_query", "recall_randomized", "recall_binomial", "recall_adaptive", "recall_normal", "supg_precision",
    "selection_forecast", "find_rare", "RARE_BATCH",
]
