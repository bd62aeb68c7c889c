"""The benchmark harness behind `vidql bench`."""
