"""What an export writes for vLLM and SGLang, parsed against the field names of the recorded versions.

The fixtures in tests/fixtures/serving/ were read from the released wheels (vllm 0.33.0, sglang 0.5.23; each
fixture names its files and their sha256): vLLM's SpeculativeConfig fields and accepted values, SGLang's
speculative flags and its top-k-1 rule. A changed field name in specray/serving/engines.py fails here.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest

from specray.serving.engines import (
    SGLANG_VERSION,
    VLLM_VERSION,
    sglang_args,
    sglang_launch,
    vllm_launch,
    vllm_speculative_config,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "serving"
VLLM = json.loads((FIXTURES / f"vllm_{VLLM_VERSION}_speculative_config.json").read_text())
SGLANG = json.loads((FIXTURES / f"sglang_{SGLANG_VERSION}_server_args.json").read_text())


def check_vllm_config(config: dict) -> None:
    """The checks vLLM's pydantic SpeculativeConfig would make of these fields (unknown names rejected)."""
    unknown = set(config) - set(VLLM["speculative_config_fields"])
    assert not unknown, f"not fields of vLLM {VLLM_VERSION}'s SpeculativeConfig: {sorted(unknown)}"
    assert config["method"] in VLLM["method_values_direct"]
    assert config["draft_sample_method"] in VLLM["draft_sample_method_values"]
    assert isinstance(config["num_speculative_tokens"], int) and config["num_speculative_tokens"] > 0


def test_fixtures_name_their_source() -> None:
    for fixture, version in ((VLLM, VLLM_VERSION), (SGLANG, SGLANG_VERSION)):
        assert fixture["version"] == version
        assert fixture["source"]["package"].startswith(f"{fixture['engine']}=={version} ")
        assert all(len(sha) == 64 for sha in fixture["source"]["files"].values())


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_vllm_speculative_config_uses_the_draft_model_method(gamma: int) -> None:
    config = vllm_speculative_config("/exports/drafts/online__tau_kd=0.8", gamma)
    check_vllm_config(config)
    assert config == {
        "method": "draft_model",
        "model": "/exports/drafts/online__tau_kd=0.8",
        "num_speculative_tokens": gamma,
        "draft_sample_method": "probabilistic",
    }


def test_vllm_launch_line_carries_the_config_as_json() -> None:
    config = vllm_speculative_config("/d", 3)
    argv = shlex.split(vllm_launch("org/target", config))
    assert argv[:3] == ["vllm", "serve", "org/target"]
    assert argv[3] == VLLM["cli_flag"] and json.loads(argv[4]) == config
    assert shlex.split(vllm_launch("org/target", None)) == ["vllm", "serve", "org/target"]


def sglang_parser() -> argparse.ArgumentParser:
    """Every recorded SGLang flag, each taking a value (the ones used here all do)."""
    parser = argparse.ArgumentParser(exit_on_error=False)
    for flag in SGLANG["flags"]:
        parser.add_argument(flag)
    return parser


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_sglang_standalone_counts_the_root_token(gamma: int) -> None:
    args = sglang_parser().parse_args(sglang_args("/exports/drafts/x", gamma))  # unknown flags raise
    assert args.speculative_algorithm == "STANDALONE" in SGLANG["speculative_algorithms"]
    assert args.speculative_draft_model_path == "/exports/drafts/x"
    assert int(args.speculative_num_steps) == gamma
    assert int(args.speculative_eagle_topk) == 1
    # SGLang's rule for top-k 1: num_draft_tokens = num_steps + 1 (the root is verified too)
    assert int(args.speculative_num_draft_tokens) == int(args.speculative_num_steps) + 1 == gamma + 1


def test_sglang_launch_line_parses() -> None:
    argv = shlex.split(sglang_launch("org/target", sglang_args("/d", 4)))
    assert argv[:3] == ["python", "-m", SGLANG["launcher_module"]]
    args = sglang_parser().parse_args(argv[3:])
    assert args.model_path == "org/target" and args.speculative_num_draft_tokens == "5"
