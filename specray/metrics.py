"""Every metric name specray writes or reads: the figures a cell's record keeps (`CellRecord.metrics`, the
fields of `specdec.records.AnalyticResult` and `EmpiricalResult`), the names they go to MLflow under, and
the columns the report and the export read them by. Named as DESIGN.md's definitions name them.

Plain strings, and no import of any stage, so every layer may name a metric: the estimators that write a
figure, the report and the export that read it, the tracker that logs it. Nothing else in `specray/` spells
a metric name as a string (`tests/unit/test_metric_names.py` reads every module's string constants); the
MLflow key of a cell's metric (`speedup_model/in_domain/tau_dec_0.6`) is built from these in
`specray.tracking.names`.
"""

from __future__ import annotations

# ---------------------------------------------------------------- a cell's figures (its record's fields)

ACCEPTANCE_RATE = "acceptance_rate"  # α: accepted / tested draft tokens (= E[β])
ACCEPTANCE_RATE_CI95 = "acceptance_rate_ci95"  # half-widths of 95% intervals: the figure's name + _ci95
DRAFT_ACCEPTANCE = "draft_acceptance"  # accepted / all drafted tokens (HF's and the papers' counting)
DRAFT_ACCEPTANCE_CI95 = "draft_acceptance_ci95"
DRAFT_ACCEPTANCE_HF = "draft_acceptance_hf"  # as HF assisted generation counts it (`ops/blocks.py`)
BLOCK_EFFICIENCY = "block_efficiency"  # τ_b: emitted tokens / target forward passes
# analytic: the exact expected tokens per step along the sampled tokens (the E of every speedup), and the
# β-based simulation the papers' figures use
BLOCK_EFFICIENCY_SAMPLED = "block_efficiency_sampled"
BLOCK_EFFICIENCY_SAMPLED_CI95 = "block_efficiency_sampled_ci95"
BLOCK_EFFICIENCY_SIMULATED = "block_efficiency_simulated"
SPEEDUP_MODEL = "speedup_model"  # the cost model's speedup (`StepCosts.speedup`)
SPEEDUP_MODEL_CI95 = "speedup_model_ci95"
SPEEDUP_MODEL_BY_BATCH = "speedup_model_by_batch"  # str(B) -> speedup_model at batch size B
SPEEDUP_MODEL_BY_BATCH_CI95 = "speedup_model_by_batch_ci95"
SPEEDUP = "speedup"  # wall time target-only / wall time speculative (empirical only)
SPEEDUP_CI95 = "speedup_ci95"
MEAN_ACCEPTANCE_LENGTH = "mean_acceptance_length"  # 1 + accepted / verification steps (vLLM's)
MEAN_ACCEPTANCE_LENGTH_CI95 = "mean_acceptance_length_ci95"
MEAN_ACCEPTANCE_LENGTH_HF = "mean_acceptance_length_hf"
ACCEPTANCE_PER_POSITION = "acceptance_per_position"  # steps accepting ≥ k+1 tokens / steps, k < γ
DRAFTED_PER_STEP = "drafted_per_step"  # what the cost model reads besides the block efficiency
TOKENS_PER_DECODE = "tokens_per_decode"
COST_TERMS = "cost_terms"  # `records.CostTerms` of an analytic cell (to resample its prompts)
# the same acceptance on exactly the empirical cells' prompts (the agreement check)
EMPIRICAL_PROMPTS_ACCEPTANCE_RATE = "empirical_prompts_acceptance_rate"
EMPIRICAL_PROMPTS_ACCEPTANCE_RATE_CI95 = "empirical_prompts_acceptance_rate_ci95"
# per test prompt, in order: what a bootstrap over prompts resamples
PER_PROMPT_TOKENS = "per_prompt_tokens"
PER_PROMPT_BETA_SUM = "per_prompt_beta_sum"
PER_PROMPT_TARGET_CALLS = "per_prompt_target_calls"
PER_PROMPT_DRAFTED = "per_prompt_drafted"
PER_PROMPT_ACCEPTED = "per_prompt_accepted"
PER_PROMPT_TESTED = "per_prompt_tested"
PER_PROMPT_SECONDS = "per_prompt_seconds"
PER_PROMPT_TARGET_ONLY_SECONDS = "per_prompt_target_only_seconds"
PER_PROMPT_TARGET_ENTROPY = "per_prompt_target_entropy"
PER_PROMPT_QUALITY = "per_prompt_quality"
PER_PROMPT = frozenset(
    {
        PER_PROMPT_TOKENS,
        PER_PROMPT_BETA_SUM,
        PER_PROMPT_TARGET_CALLS,
        PER_PROMPT_DRAFTED,
        PER_PROMPT_ACCEPTED,
        PER_PROMPT_TESTED,
        PER_PROMPT_SECONDS,
        PER_PROMPT_TARGET_ONLY_SECONDS,
        PER_PROMPT_TARGET_ENTROPY,
        PER_PROMPT_QUALITY,
    }
)
TARGET_ONLY_SECONDS = "target_only_seconds"
# task quality of decoded outputs (`specray/quality.py`: `quality_metrics` writes `<prefix>`,
# `<prefix>_ci95` and `<prefix>_metric` for the headline metric); the `ends` records carry the target's
# and the draft's own, decoding alone
QUALITY = "quality"
QUALITY_CI95 = "quality_ci95"
QUALITY_METRIC = "quality_metric"  # which metric `quality` is: exact_match or rougeL
QUALITY_TARGET, QUALITY_TARGET_CI95 = "quality_target", "quality_target_ci95"
QUALITY_DRAFT, QUALITY_DRAFT_CI95 = "quality_draft", "quality_draft_ci95"
# and the tokens each decoded, by the figure its quality is under
TOKENS_ALONE = {QUALITY_TARGET: "tokens_target", QUALITY_DRAFT: "tokens_draft"}
# a cell's per-category entries (`specray.specdec.categories`)
BY_CATEGORY = "by_category"  # category -> {figure: value}
PROMPT_CATEGORIES = "prompt_categories"  # each test prompt's category, in order
PROMPT_CONVERSATIONS = "prompt_conversations"  # each test prompt's conversation

# what an export's route states it expects (routing.json), from the cell at its binding τ_dec
ROUTE_EXPECTED = (
    ACCEPTANCE_RATE,
    ACCEPTANCE_RATE_CI95,
    DRAFT_ACCEPTANCE,
    DRAFT_ACCEPTANCE_CI95,
    DRAFT_ACCEPTANCE_HF,
    MEAN_ACCEPTANCE_LENGTH,
    MEAN_ACCEPTANCE_LENGTH_CI95,
    MEAN_ACCEPTANCE_LENGTH_HF,
    ACCEPTANCE_PER_POSITION,
    BLOCK_EFFICIENCY_SAMPLED,
    BLOCK_EFFICIENCY_SAMPLED_CI95,
)

# ---------------------------------------------------------------- names in MLflow beyond the fields

EMPIRICAL_ACCEPTANCE_RATE = "empirical_acceptance_rate"
EMPIRICAL_BLOCK_EFFICIENCY = "empirical_block_efficiency"
# what servers report (vLLM's definitions); analytic ones expected from β, like speedup_model
EMPIRICAL_MEAN_ACCEPTANCE_LENGTH = "empirical_mean_acceptance_length"
DRAFT_ACCEPTANCE_MODEL = "draft_acceptance_model"
EMPIRICAL_ACCEPTANCE_PER_POSITION = "empirical_acceptance_per_position"  # one metric per position
QUALITY_TARGET_ONLY, QUALITY_DRAFT_ONLY = "quality_target_only", "quality_draft_only"
BLOCK_EFFICIENCY_BETA = "block_efficiency_beta"  # from β: overstates at τ > 0, kept for the papers' figures
LATENCY_MS_PER_TOKEN = "latency_ms_per_token"  # a garden point's latency at batch 1

# record field -> metric name, per estimator (analytic block efficiency: the exact expected tokens per step
# along the sampled tokens, the E of every speedup; its β-based simulation is named as such)
CELL_METRICS = {
    "analytic": {
        ACCEPTANCE_RATE: ACCEPTANCE_RATE,
        BLOCK_EFFICIENCY_SAMPLED: BLOCK_EFFICIENCY,
        BLOCK_EFFICIENCY_SIMULATED: BLOCK_EFFICIENCY_BETA,
        SPEEDUP_MODEL: SPEEDUP_MODEL,
        MEAN_ACCEPTANCE_LENGTH: MEAN_ACCEPTANCE_LENGTH,
        DRAFT_ACCEPTANCE: DRAFT_ACCEPTANCE_MODEL,
        ACCEPTANCE_PER_POSITION: ACCEPTANCE_PER_POSITION,
    },
    "empirical": {
        ACCEPTANCE_RATE: EMPIRICAL_ACCEPTANCE_RATE,
        DRAFT_ACCEPTANCE: DRAFT_ACCEPTANCE,
        BLOCK_EFFICIENCY: EMPIRICAL_BLOCK_EFFICIENCY,
        SPEEDUP: SPEEDUP,
        MEAN_ACCEPTANCE_LENGTH: EMPIRICAL_MEAN_ACCEPTANCE_LENGTH,
        ACCEPTANCE_PER_POSITION: EMPIRICAL_ACCEPTANCE_PER_POSITION,
        QUALITY: QUALITY,
    },
    "ends": {QUALITY_TARGET: QUALITY_TARGET_ONLY, QUALITY_DRAFT: QUALITY_DRAFT_ONLY},
}
# what a cell keeps per category (`specray.specdec.categories`) -> its metric name, per estimator (named as
# the cell's own figures are)
CATEGORY_FIGURES = {
    "analytic": {
        ACCEPTANCE_RATE: ACCEPTANCE_RATE,
        BLOCK_EFFICIENCY: BLOCK_EFFICIENCY,
        SPEEDUP_MODEL: SPEEDUP_MODEL,
        MEAN_ACCEPTANCE_LENGTH: MEAN_ACCEPTANCE_LENGTH,
        DRAFT_ACCEPTANCE: DRAFT_ACCEPTANCE_MODEL,
    },
    "empirical": {
        ACCEPTANCE_RATE: EMPIRICAL_ACCEPTANCE_RATE,
        BLOCK_EFFICIENCY: EMPIRICAL_BLOCK_EFFICIENCY,
        SPEEDUP: SPEEDUP,
        MEAN_ACCEPTANCE_LENGTH: EMPIRICAL_MEAN_ACCEPTANCE_LENGTH,
        DRAFT_ACCEPTANCE: DRAFT_ACCEPTANCE,
        QUALITY: QUALITY,
    },
}
