"""From a sweep spec to evaluation cells: the test prompts, the settings, and the (draft × τ_dec × test set ×
estimator) jobs. Pure planning — no models are run here."""

from __future__ import annotations

from collections.abc import Mapping

from transformers import PreTrainedTokenizerBase

from specray.config import EvalSpec, SweepSpec
from specray.data.dataset import build_splits
from specray.data.templates import format_prompt
from specray.models.loading import check_same_vocabulary, load_tokenizer
from specray.specdec.evaluator import EvalJob, EvalSettings

TEST_SPLITS = {"in_domain": "in_domain_test", "out_of_domain": "out_of_domain_test"}


def eval_settings(spec: EvalSpec) -> EvalSettings:
    return EvalSettings(
        gamma=spec.gamma,
        repeats=spec.repeats,
        max_new_tokens=spec.max_new_tokens,
        empirical_prompts=spec.empirical_prompts,
        seed=spec.seed,
        cost_ratio=spec.draft_cost_ratio,
    )


def encode_test_prompts(spec: SweepSpec, tokenizer: PreTrainedTokenizerBase) -> dict[str, list[list[int]]]:
    """Token ids of every test prompt per test set, cut to `data.max_prompt_tokens` from the left (the end
    of an Alpaca prompt, "### Response:", is what the model continues from)."""
    splits = build_splits(spec.data)
    limit = spec.data.max_prompt_tokens
    prompts = {}
    for test_set in spec.eval.test_sets:
        texts = [
            format_prompt(e.instruction, e.input, spec.data.template) for e in splits[TEST_SPLITS[test_set]]
        ]
        prompts[test_set] = [ids[-limit:] for ids in tokenizer(texts)["input_ids"]]
    return prompts


def plan_jobs(
    spec: EvalSpec, drafts: dict[str, str], tau_kd: Mapping[str, float | None] | None = None
) -> list[EvalJob]:
    """Every cell: analytic at every τ_dec, empirical at `empirical_temperatures`, per draft and test set.

    With `empirical_drafts: diagonal`, empirical cells go only to drafts whose single τ_kd equals that τ_dec
    and to drafts without one (the un-distilled draft, mixtures); `tau_kd` maps draft names to their τ_kd.
    """
    tau_kd = tau_kd or {}
    jobs = []
    for name, path in drafts.items():
        for test_set in spec.test_sets:
            if "analytic" in spec.estimators:
                jobs += [EvalJob(name, path, tau, test_set, "analytic") for tau in spec.temperatures]
            if "empirical" not in spec.estimators:
                continue
            for tau in spec.empirical_temperatures:
                if spec.empirical_drafts == "all" or tau_kd.get(name) in (None, tau):
                    jobs.append(EvalJob(name, path, tau, test_set, "empirical"))
    return jobs


def check_drafts(target_path: str, drafts: dict[str, str]) -> None:
    """Refuse, before any decoding, a draft that is missing or whose vocabulary differs from the target's."""
    target_tokenizer = load_tokenizer(target_path)
    for path in drafts.values():
        check_same_vocabulary(target_tokenizer, load_tokenizer(path), target_path, path)
