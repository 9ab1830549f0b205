"""`specray tune`: the Ray Tune search over mixtures of τ_kd shards (docstring of `run.py`).

Modules: `run` (the driver: its stages in order, the report, the registered winner), `driver` (what the
stages share: a recipe's draft at a budget, training and measuring drafts), `search_stage` (the search
budget: baselines, the search, the search's own Table 3), `final` (the full budget: Table 3's drafts
retrained with replicates, the rank agreement's recipes), `outputs` (the report folder), `search` (the
Tuner), `space` (the search space, budgets and the objective), `trial` (one trial, in its own process) and
`baselines` (the paper's single-τ_kd and manual recipes, Table 3's frame).
"""

from specray.sweep.tune.run import SearchFailed, run_tune, tune_dir

__all__ = ["SearchFailed", "run_tune", "tune_dir"]
