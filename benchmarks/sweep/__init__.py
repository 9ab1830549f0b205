"""Whole sweeps: what MLflow lineage (datasets, logged models) adds to a sweep's wall time."""
