"""Catalog, SQL dialect, planner, oracles and the durable label cache."""
