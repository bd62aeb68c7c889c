"""The catalog: videos as collections of clips, catalog upgrades, index store, executors."""
