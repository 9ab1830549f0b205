"""`specray tune`'s two budgets: a full-budget draft is the sweep's own draft, names mark the search budget,
bad budget settings fail at load, Table 3 takes a recipe's γ on its mean, and the rank agreement."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import specray.sweep.tune.driver as driver
from specray.config import load_spec
from specray.draft import representative, split_replicate
from specray.errors import SpecError
from specray.report.table3 import RANK_COLUMNS, rank_agreement
from specray.specdec.records import CellRecord
from specray.sweep.plan import plan_sweep
from specray.sweep.tune.baselines import Contenders, table3
from specray.sweep.tune.driver import Tune, budget_name, one_folder_per_key
from specray.sweep.tune.space import Recipe, at_budget, baseline_recipe, final_budget, steps_budget
from tests.conftest import REPO


def tune_tiny(*overrides: str):
    return load_spec(REPO / "sweeps" / "tune_tiny.yaml", list(overrides))


def planned(spec) -> Tune:
    """The tune's draft planner without stages or MLflow (planning touches neither)."""
    return Tune(plan_sweep(spec, validation=True), Path(spec.output_dir) / spec.name / "tune", None, None)  # type: ignore[arg-type]


def test_the_full_budget_is_the_included_sweeps_own_unless_set() -> None:
    spec = tune_tiny()
    assert (steps_budget(spec), final_budget(spec)) == (100, 400)  # tiny.yaml trains offline drafts 400 steps
    assert final_budget(tune_tiny("tune.final_steps=250")) == 250
    online = tune_tiny("tune.paradigm=online")
    assert final_budget(online) == online.distill.online_steps == 600  # the paradigm's own steps
    winner = Recipe("offline", {0.8: 0.5, 1.0: 0.5}, {"steps": 100, "divergence": "rkl"})
    assert at_budget(winner, 400).distill == {"steps": 400, "divergence": "rkl"}  # only the budget changes
    assert budget_name("offline/tau_kd=1", 100, 400) == "offline/tau_kd=1@100"
    assert budget_name("offline/tau_kd=1", 400, 400) == "offline/tau_kd=1"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("tune.final_steps=0", r"tune.final_steps: Input should be greater than or equal to 1"),
        ("tune.replicates=0", r"tune.replicates: Input should be greater than or equal to 1"),
    ],
)
def test_bad_budget_settings_fail_at_load_naming_the_field(override: str, message: str) -> None:
    with pytest.raises(SpecError, match=message) as caught:
        tune_tiny(override)
    assert len(str(caught.value).splitlines()) == 1


def test_a_full_budget_draft_is_the_sweeps_own_draft_and_is_found_in_its_folder(
    tmp_path, monkeypatch
) -> None:
    out = f"output_dir={tmp_path}"
    sweep = plan_sweep(load_spec(REPO / "sweeps" / "tiny.yaml", [out, "distill.replicates=3"]))
    keys = {draft.name: draft.key for draft in sweep.drafts}
    spec = tune_tiny(out)
    run = planned(spec)
    full = baseline_recipe(spec, {0.6: 1.0}, final_budget(spec))
    drafts = [run.draft(full, replicate) for replicate in range(3)]
    assert [d.name for d in drafts] == [
        "offline/tau_kd=0.6",
        "offline/tau_kd=0.6/r1",
        "offline/tau_kd=0.6/r2",
    ]
    assert all(keys[d.name] == d.key for d in drafts)  # replicate r: distill.seed + r, as the sweep's
    assert drafts[0].folder == tmp_path / "tune_tiny" / "tune" / "final" / "offline__tau_kd=0.6"
    search = run.draft(baseline_recipe(spec, {0.6: 1.0}))
    assert search.name == "offline/tau_kd=0.6@100" and search.key not in keys.values()
    assert search.folder.parent.name == "baselines"

    # once `specray run sweeps/tiny.yaml` published it (same key), the tune reads that folder
    sibling = tmp_path / "tiny" / "drafts" / "offline__tau_kd=0.6__r1"
    sibling.mkdir(parents=True)
    published = {(sibling, drafts[1].key)}
    monkeypatch.setattr(driver, "is_finished", lambda folder, key: (Path(folder), key) in published)
    found = run.draft(full, 1)
    assert found.folder == tmp_path / "tiny" / "drafts" / "offline__tau_kd=0.6__r1"
    other_key = run.draft(baseline_recipe(spec, {0.6: 1.0}, 300), 1)  # another budget: not that draft
    assert other_key.folder.parent == tmp_path / "tune_tiny" / "tune" / "baselines"


def test_two_names_of_one_draft_share_its_folder() -> None:
    spec = tune_tiny("output_dir=/nonexistent")
    run = planned(spec)
    manual = run.draft(baseline_recipe(spec, {0.8: 1.0, 0.9: 1.0, 1.0: 1.0}, 400))
    tuned = run.draft(baseline_recipe(spec, {0.8: 1.0, 0.9: 1.0, 1.0: 1.0}, 400), name="tuned:x")
    assert manual.key == tuned.key and manual.folder != tuned.folder
    same = one_folder_per_key([manual, tuned])
    assert [d.name for d in same] == [manual.name, "tuned:x"] and same[1].folder == manual.folder


# ---------------------------------------------------------------- choosing among replicates


def test_the_representative_replicate_is_the_one_closest_to_the_mean() -> None:
    assert representative({"a": 2.4, "a/r1": 1.5, "a/r2": 1.5}) == "a/r1"  # mean 1.8: not the lucky 2.4
    assert representative({"b": 1.9, "b/r1": 1.9, "b/r2": 1.85}) == "b"  # ties: the first
    assert split_replicate("tuned:offline/mix=0.8:1,1:1/r2") == ("tuned:offline/mix=0.8:1,1:1", 2)
    assert split_replicate("online/tau_kd=1/rkl/gkd") == ("online/tau_kd=1/rkl/gkd", 0)
    with pytest.raises(ValueError, match="at least one replicate"):
        representative({})


def _record(draft: str, gamma: int, speedup: float, tau: float = 1.0) -> CellRecord:
    metrics = {"speedup_model": speedup, "acceptance_rate": 0.5}
    return CellRecord(draft, "K", "in_domain", tau, "analytic", gamma, f"{draft}{gamma}", 0.1, 0.0, metrics)


def test_table3_takes_a_recipes_gamma_on_its_mean_over_replicates() -> None:
    # γ 3 has the best single draw (replicate 0's 2.0), γ 5 the better mean (1.6 vs 1.45)
    records = [_record("t", 3, 2.0), _record("t/r1", 3, 0.9), _record("t", 5, 1.6), _record("t/r1", 5, 1.6)]
    records += [_record("s", 3, 1.0), _record("m", 3, 1.2)]
    contenders = Contenders("t", {1.0: "s"}, {1.0: "m"}, {"s": "1", "m": "0.9+1", "t": "x"})
    (row,) = table3(records, contenders, {"t": "t", "t/r1": "t"}).to_dict("records")
    assert row["tuned speedup_model"] == pytest.approx(1.6) and row["tuned gain"] == pytest.approx(0.6)


# ---------------------------------------------------------------- rank agreement


def _ranks(search: list[float], full: list[float]) -> pd.DataFrame:
    rows = [(f"r{i}", "single", s, f, 1) for i, (s, f) in enumerate(zip(search, full, strict=True))]
    return pd.DataFrame(rows, columns=list(RANK_COLUMNS))


def test_the_rank_agreement_says_when_the_short_budget_ranks_recipes_weakly() -> None:
    rng = np.random.default_rng(0)
    search = list(np.linspace(1.0, 1.5, 12))
    strong = rank_agreement(_ranks(search, [s + 0.01 * rng.standard_normal() for s in search]))
    assert strong.rho > 0.9 and strong.low > 0.5 and not strong.weak and strong.warning == ""
    weak = rank_agreement(_ranks(search, list(rng.permutation(search))))
    assert weak.weak and "ranks recipes weakly" in weak.warning and weak.low < 0 < weak.high
    few = rank_agreement(_ranks([1.0, 1.2, 1.1], [1.0, 1.1, 1.2]))
    assert np.isnan(few.low) and few.weak and "Too few recipes" in few.warning
    assert "over 12 recipes (95% CI [" in strong.line
    assert strong.best("single")[0] == "r11" and strong.best("manual") is None
    assert "best single τ_kd on validation is `r11`" in strong.best_single_line


def test_export_refuses_a_tune_run_without_retrained_drafts(tmp_path) -> None:
    from specray.serving.tune_source import read_source

    folder = tmp_path / "smoke" / "tune"
    (folder / "report").mkdir(parents=True)
    (folder / "tune.json").write_text("{}")  # a search that never reached the full budget
    for given in (folder, folder / "report"):
        with pytest.raises(SpecError, match=r"without retrained drafts .*tune\.final_steps") as caught:
            read_source(str(given))
        assert len(str(caught.value).splitlines()) == 1
    # the folder above it: named the folder it wants, not told to run a sweep again
    with pytest.raises(SpecError) as caught:
        read_source(str(tmp_path / "smoke"))
    assert str(caught.value) == (
        f"{tmp_path / 'smoke'} holds a `specray tune` run, not a sweep: give its tune folder, {folder}"
    )
    (tmp_path / "other" / "tune").mkdir(parents=True)  # a folder named tune is no tune without its state
    with pytest.raises(SpecError, match=r"no spec\.yaml; run `specray run`"):
        read_source(str(tmp_path / "other"))


def test_every_row_of_table3_gets_its_own_interval_over_training_and_prompts() -> None:
    from specray.report.composition import Composition
    from specray.report.table3 import gain_intervals, table3_frame
    from tests.unit.test_verdicts import DIFFICULTY, cell

    # the tuned recipe gains 10% at τ_dec 0.8 and 20% at 1.0 on average over its 3 replicates, which
    # differ by ±2%; the manual recipe gains nothing
    gains = {0.8: 0.10, 1.0: 0.20}
    rows, cells = [], []
    for tau, gain in gains.items():
        names = {"single draft": "single", "manual draft": "manual", "tuned draft": "tuned"}
        rows.append({"test_set": "in_domain", "tau_dec": tau, "manual gain": 0.0, "tuned gain": gain} | names)
        rows[-1] |= {"single tau_kd": "1", "manual recipe": "0.9+1", "tuned speedup_model": 1.0 + gain}
        rows[-1] |= {"single speedup_model": 1.0, "manual speedup_model": 1.0}
        for r, spread in enumerate((-0.02, 0.0, 0.02)):
            for name, factor in (("single", 1.0), ("manual", 1.0), ("tuned", 1.0 + gain + spread)):
                cells.append(cell(name, tau, DIFFICULTY * factor) | {"recipe": name, "replicate": r})
    table = gain_intervals(Composition(pd.DataFrame(rows), pd.DataFrame(cells)))
    for tau, gain in gains.items():
        (row,) = table[table.tau_dec == tau].to_dict("records")
        assert row["tuned gain low"] < gain < row["tuned gain high"]
        assert row["tuned gain high"] - row["tuned gain low"] > 0.04  # the replicates' ±2% counts
        assert row["tuned replicates agree"] == "3/3" and row["manual replicates agree"] == "0/3"
    shown = table3_frame(table)
    assert shown["tuned: replicates agree"].tolist() == ["3/3", "3/3"]
    assert shown["tuned gain [95% CI]"].iloc[0].startswith("+10.0% [")
