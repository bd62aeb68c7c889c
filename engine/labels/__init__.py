"""Oracles and their labels: the oracle kinds, the durable label journal and cache, clip maps."""
