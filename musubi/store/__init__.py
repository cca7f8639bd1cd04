"""The run directory layout (and, later, the SQLite index of runs)."""
