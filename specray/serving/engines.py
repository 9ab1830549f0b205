"""Serving engines' speculative-decoding settings for one band: vLLM's `--speculative-config` JSON for its
draft-model method and SGLang's STANDALONE launch arguments.

Field names are those of the versions below, read from their released wheels (the sources and the field
lists are kept in tests/fixtures/serving/, and a test parses what is written here against them):
- vLLM 0.33.0, `vllm/config/speculative.py` (class SpeculativeConfig): `method="draft_model"` loads a
  separate HF draft model (`model`) that proposes `num_speculative_tokens` = γ tokens per step;
  `draft_sample_method="probabilistic"` samples the draft at the request's temperature and verifies with
  the full draft distribution — the speculative sampling our acceptance model describes. vLLM's default,
  "greedy", drafts the argmax and verifies it as a one-hot draft distribution, which accepts less at τ > 0.
  A γ per batch size is `num_speculative_tokens_per_batch_size: list[tuple[int, int, int]] | None`
  (speculative.py line 524): entries `(range_start, range_end, num_speculative_tokens)` over *inclusive*
  ranges of the running batch size, non-overlapping, the first starting at 1, each K >= 0 (0: no drafting at
  that size) and capped at `num_speculative_tokens`; the last K carries on above the last range
  (`vllm/v1/spec_decode/dynamic/utils.py`, validate_and_normalize_dynamic_sd_schedule and
  build_dynamic_sd_schedule_lookup). It is written only where the γ differ: a schedule makes vLLM's V1
  model runner fall back from full to piecewise CUDA graphs (`vllm/config/vllm.py`,
  _maybe_override_dynamic_sd_cudagraph_mode); the draft-model method keeps it on V1
  (_maybe_disable_dynamic_sd_for_v1), data parallelism turns it off.
- SGLang 0.5.23, `sglang/srt/arg_groups/fields/spec.py` (class Spec) and `speculative_hook.py`:
  `--speculative-algorithm STANDALONE` loads a plain draft model; `--speculative-num-steps` = γ draft steps,
  `--speculative-eagle-topk 1` one chain, and `--speculative-num-draft-tokens` counts the tokens verified
  per step *including the root*, so it is γ + 1 (with top-k 1 SGLang resets any other value to
  num_steps + 1). SGLang drafts the top-1 token of the draft, so its acceptance at τ > 0 is not the one
  predicted here (the README of an export says so). SGLang's STANDALONE takes one γ for every batch size:
  its `--speculative-adaptive` / `--speculative-adaptive-config` (a JSON of `candidate_steps` per batch
  size) only drives EAGLE and EAGLE3 — `adaptive_unsupported_reason` (sglang/srt/speculative/
  adaptive_spec_params.py, line 56) turns it off for any other algorithm, and speculative_hook.py falls back
  to the static arguments — and it moves num_steps by the acceptance it observes rather than holding a γ
  per batch size, so no adaptive config is written: SGLang gets the γ of the smallest batch size.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence

VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"
# the inclusive upper end written for the last batch band (open above): vLLM clamps every range at its
# max_num_seqs, so any larger value means "every batch size from here up"
VLLM_OPEN_BATCH_END = 2**31 - 1

BatchGamma = tuple[int, int | None, int]  # a batch band [low, high) (high None: open above) and its γ


def vllm_batch_schedule(per_batch: Sequence[BatchGamma]) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size` for batch bands [low, high) with their γ (0: no
    speculation): inclusive `[range_start, range_end, K]` entries, the first from 1, the last open."""
    if not per_batch or per_batch[0][0] != 1:
        raise ValueError(f"batch bands must start at 1, got {list(per_batch)}")
    for (_, high, _), (low, _, _) in zip(per_batch, per_batch[1:], strict=False):
        if high != low:
            raise ValueError(f"batch bands must be contiguous, got {list(per_batch)}")
    return [[low, VLLM_OPEN_BATCH_END if high is None else high - 1, g] for low, high, g in per_batch]


def vllm_speculative_config(
    draft_dir: str, gamma: int, per_batch: Sequence[BatchGamma] = ()
) -> dict[str, object]:
    """vLLM's `--speculative-config` for the draft-model method with γ tokens per step; with batch bands
    whose γ differ, vLLM's schedule of γ by batch size, `num_speculative_tokens` then their largest (vLLM
    caps each entry at it)."""
    config: dict[str, object] = {
        "method": "draft_model",
        "model": draft_dir,
        "num_speculative_tokens": gamma,
        "draft_sample_method": "probabilistic",
    }
    if len({g for _, _, g in per_batch}) > 1:
        config["num_speculative_tokens"] = max(g for _, _, g in per_batch)
        config["num_speculative_tokens_per_batch_size"] = vllm_batch_schedule(per_batch)
    return config


def vllm_launch(target: str, speculative_config: dict[str, object] | None) -> str:
    """The `vllm serve` line for the target, with speculative decoding when a config is given."""
    argv = ["vllm", "serve", target]
    if speculative_config is not None:
        argv += ["--speculative-config", json.dumps(speculative_config, sort_keys=True)]
    return shlex.join(argv)


def sglang_args(draft_dir: str, gamma: int) -> list[str]:
    """SGLang's STANDALONE speculative-decoding arguments for γ draft tokens per step."""
    return [
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-draft-model-path",
        draft_dir,
        "--speculative-num-steps",
        str(gamma),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(gamma + 1),  # SGLang counts the verified tokens with the root: γ drafted + 1
    ]


def sglang_launch(target: str, args: list[str] | None) -> str:
    """The `python -m sglang.launch_server` line for the target, with the speculative arguments if any."""
    argv = ["python", "-m", "sglang.launch_server", "--model-path", target, *(args or [])]
    return shlex.join(argv)
