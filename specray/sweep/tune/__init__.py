"""`specray tune`: the Ray Tune search over mixtures of τ_kd shards (docstring of `run.py`).

Modules: `run` (the driver: stages, baselines' measurement, Table 3), `search` (the Tuner), `space` (the
search space, budgets and the objective), `trial` (one trial, in its own process) and `baselines` (the
paper's single-τ_kd and manual recipes).
"""

from specray.sweep.tune.run import SearchFailed, run_tune, tune_dir

__all__ = ["SearchFailed", "run_tune", "tune_dir"]
