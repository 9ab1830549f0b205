"""Every MLflow call in specray lives in this package, split by concern:
- `names`: metric keys, tags and run names (plain strings, no MLflow import: a module below the sweep
  may name a metric without loading MLflow);
- `client`: the `Tracker`, one experiment's runs, params, metrics, datasets, models and views;
- `errors`: a failed call or an absent server turned into one line naming the server and the cause;
- `lineage`: what the UI shows about a sweep (datasets, logged drafts, descriptions, the runs view);
- `fetch`: a finished sweep's records read back from its parent run.

Nothing is imported here, so `specray.tracking.names` loads without MLflow.

Layout of a sweep in MLflow (experiment = the sweep's name, or `tracking.experiment`):
- one parent run per sweep invocation, tagged `specray.role=sweep` and `specray.spec_key=<hash of the
  resolved spec>`, with the resolved spec as params (flattened: `eval.gamma`, ...) and as `spec.yaml`;
  figures and tables of the report are its artifacts. Re-running a sweep whose parent did not finish
  resumes that parent instead of starting another;
- one child run per draft (`mlflow.parentRunId` set), tagged `draft`, `paradigm`, `tau_kd`, `mixture`, with
  its training curves (metrics with steps) and one metric per evaluation cell, named
  `<metric>/<test_set>/tau_dec_<x>` (MLflow metric names cannot contain "=").

`specray tune` uses the same experiment: one parent run per search (`specray.role=tune`), one child run
per Tune trial (`specray.role=trial`, tag `trial_id`; its config as params, its curves as metrics, the
best one tagged `specray.best=true`), one child run per baseline draft, and the winner's draft registered
in the Model Registry with its mixture in the version's tags.

What the UI shows (MLflow 3.17): the experiment is tagged a model-development one (`mlflow.experimentKind`)
and described (`mlflow.note.content`); runs are named for people (`tiny · online τ_kd=0.6`) and described;
the data a run used are its dataset inputs (name, content key as digest, context); every finished draft is
a logged model (a thin pyfunc over its HF folder, the KD recipe in its metadata and params) linked to its
run and, for the tuned winner, to its registered version; and a saved runs view (an experiment tag the UI
lists under "Views") shows the drafts ranked, with the columns a user compares.
"""
