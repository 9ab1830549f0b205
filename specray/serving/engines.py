"""Serving engines' speculative-decoding settings for one band: vLLM's `--speculative-config` JSON for its
draft-model method and SGLang's STANDALONE launch arguments.

Field names are those of the versions below, read from their released wheels (the sources and the field
lists are kept in tests/fixtures/serving/, and a test parses what is written here against them):
- vLLM 0.33.0, `vllm/config/speculative.py` (class SpeculativeConfig): `method="draft_model"` loads a
  separate HF draft model (`model`) that proposes `num_speculative_tokens` = γ tokens per step;
  `draft_sample_method="probabilistic"` samples the draft at the request's temperature and verifies with
  the full draft distribution — the speculative sampling our acceptance model describes. vLLM's default,
  "greedy", drafts the argmax and verifies it as a one-hot draft distribution, which accepts less at τ > 0.
- SGLang 0.5.23, `sglang/srt/arg_groups/fields/spec.py` (class Spec) and `speculative_hook.py`:
  `--speculative-algorithm STANDALONE` loads a plain draft model; `--speculative-num-steps` = γ draft steps,
  `--speculative-eagle-topk 1` one chain, and `--speculative-num-draft-tokens` counts the tokens verified
  per step *including the root*, so it is γ + 1 (with top-k 1 SGLang resets any other value to
  num_steps + 1). SGLang drafts the top-1 token of the draft, so its acceptance at τ > 0 is not the one
  predicted here (the README of an export says so).
"""

from __future__ import annotations

import json
import shlex

VLLM_VERSION = "0.33.0"
SGLANG_VERSION = "0.5.23"


def vllm_speculative_config(draft_dir: str, gamma: int) -> dict[str, object]:
    """vLLM's `--speculative-config` for the draft-model method with γ tokens per step."""
    return {
        "method": "draft_model",
        "model": draft_dir,
        "num_speculative_tokens": gamma,
        "draft_sample_method": "probabilistic",
    }


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
