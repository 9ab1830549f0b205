"""The acceptance probe against the eval's analytic estimator: the same continuations, the same β.

The probe scores every τ_dec from one target sampling call and one pass of the draft over prompt caches;
the estimator (`specdec/analytic.py`, over `specdec/continuations.py`'s samples) samples each τ_dec on
its own and runs the draft over prompt + response. Both must give the same tokens and the same α and
per-prompt β sums, up to fp round-off.
"""

from __future__ import annotations

import pytest
import torch

from specray.distill.probe import AcceptanceProbe
from specray.models.loading import load_model, load_tokenizer
from specray.specdec.analytic import AnalyticEstimator
from specray.specdec.continuations import sample_continuations

TAUS = (0.0, 0.4, 1.0, 2.0)
NEW_TOKENS = 10
TEXTS = ["Sort 3, 1, 2.", "List two fruits.", "Copy: the cat sat.", "Count the words in: a b c.", "Hi."]


@pytest.fixture(scope="module")
def models(micro_zoo):
    torch.manual_seed(0)
    tokenizer = load_tokenizer(str(micro_zoo.target))
    prompts = [list(ids) for ids in tokenizer(TEXTS)["input_ids"]]
    return load_model(str(micro_zoo.target)), load_model(str(micro_zoo.draft)), tokenizer, prompts


def _estimated(target, draft, prompts, tokenizer, tau: float) -> tuple[float, list[int], list[float]]:
    """α, per-prompt tokens and β sums from the eval's estimator at one τ_dec."""
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    continuations = sample_continuations(target, prompts, tau, NEW_TOKENS, eos, 3, pad)
    beta, mask = AnalyticEstimator(target, continuations, pad).beta(draft)
    sums = (beta.double() * mask).sum(dim=1)
    return float(sums.sum() / mask.sum()), mask.sum(dim=1).tolist(), sums.tolist()


def test_the_probe_equals_the_analytic_estimator_at_every_tau(models) -> None:
    target, draft, tokenizer, prompts = models
    probe = AcceptanceProbe(target, prompts, TAUS, NEW_TOKENS, tokenizer.eos_token_id, 0, seed=3)
    acceptance, per_prompt = probe(draft)
    for tau in TAUS:
        alpha, tokens, sums = _estimated(target, draft, prompts, tokenizer, tau)
        assert list(per_prompt[tau].tokens) == tokens  # the same continuations
        assert acceptance[tau] == pytest.approx(alpha, abs=1e-5)
        assert list(per_prompt[tau].beta_sums) == pytest.approx(sums, abs=1e-5)
    assert 0.0 < acceptance[1.0] < 1.0 and acceptance[0.0] != acceptance[1.0]


def test_the_target_accepts_itself_and_train_mode_is_restored(models) -> None:
    target, draft, tokenizer, prompts = models
    probe = AcceptanceProbe(target, prompts, TAUS, NEW_TOKENS, tokenizer.eos_token_id, 0)
    same, _ = probe(target)
    assert all(same[tau] == pytest.approx(1.0, abs=1e-4) for tau in TAUS)
    draft.train()
    probe(draft)
    assert draft.training
