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
    VLLM_OPEN_BATCH_END,
    VLLM_VERSION,
    sglang_args,
    sglang_launch,
    vllm_batch_schedule,
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
    if "num_speculative_tokens_per_batch_size" in config:
        check_vllm_schedule(config["num_speculative_tokens_per_batch_size"], config["num_speculative_tokens"])


def check_vllm_schedule(schedule: list, num_speculative_tokens: int) -> None:
    """What vLLM checks of `num_speculative_tokens_per_batch_size` (the fixture's rules), and that its cap
    at num_speculative_tokens leaves every γ as written."""
    rules = VLLM["num_speculative_tokens_per_batch_size"]
    assert rules["annotation"] == "list[tuple[int, int, int]] | None" and rules["range_end_inclusive"]
    assert isinstance(schedule, list) and schedule
    previous_end = 0
    for entry in schedule:
        assert isinstance(entry, list) and len(entry) == len(rules["entry"]) == 3
        start, end, k = entry
        assert all(isinstance(v, int) for v in entry)
        assert rules["range_min"] <= start <= end and k >= rules["num_speculative_tokens_min"]
        assert start > previous_end  # sorted, non-overlapping
        assert k <= num_speculative_tokens  # vLLM would cap it
        previous_end = end
    assert schedule[0][0] == rules["first_range_start"]


def vllm_lookup(schedule: list, batch_size: int) -> int:
    """K at a batch size as vLLM's dense lookup reads the schedule (inclusive ranges; a gap or the tail
    takes the previous range's K)."""
    return [k for start, _, k in schedule if start <= batch_size][-1]


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


def test_vllm_gets_a_gamma_per_batch_size_where_they_differ() -> None:
    per_batch = [(1, 4, 4), (4, 16, 3), (16, None, 0)]
    config = vllm_speculative_config("/d", 4, per_batch)
    check_vllm_config(config)
    schedule = config["num_speculative_tokens_per_batch_size"]
    assert schedule == [[1, 3, 4], [4, 15, 3], [16, VLLM_OPEN_BATCH_END, 0]]
    assert config["num_speculative_tokens"] == 4  # the largest γ: vLLM caps every entry at it
    for b, gamma in ((1, 4), (3, 4), (4, 3), (15, 3), (16, 0), (4096, 0)):
        assert vllm_lookup(schedule, b) == gamma
    assert json.loads(shlex.split(vllm_launch("t", config))[4]) == config  # JSON on the command line


def test_the_largest_gamma_sets_num_speculative_tokens_even_above_the_first_batch() -> None:
    config = vllm_speculative_config("/d", 2, [(1, 8, 2), (8, None, 5)])
    check_vllm_config(config)
    assert config["num_speculative_tokens"] == 5
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 7, 2], [8, VLLM_OPEN_BATCH_END, 5]]


def test_one_gamma_for_every_batch_writes_no_schedule() -> None:
    """A schedule would cost vLLM's V1 runner its full CUDA graphs for nothing."""
    assert "num_speculative_tokens_per_batch_size" not in vllm_speculative_config(
        "/d", 3, [(1, 4, 3), (4, None, 3)]
    )
    assert "num_speculative_tokens_per_batch_size" not in vllm_speculative_config("/d", 3, [(1, None, 3)])


def test_a_schedule_needs_contiguous_bands_from_one() -> None:
    with pytest.raises(ValueError, match="start at 1"):
        vllm_batch_schedule([(2, None, 3)])
    with pytest.raises(ValueError, match="contiguous"):
        vllm_batch_schedule([(1, 4, 3), (8, None, 2)])


def test_sglang_adaptive_mode_does_not_drive_a_standalone_draft() -> None:
    """SGLang's --speculative-adaptive (per batch size candidate steps) is EAGLE/EAGLE3 only; the export
    writes no adaptive config for STANDALONE and its README says so."""
    from specray.serving.readme import export_readme

    adaptive = SGLANG["adaptive"]
    assert set(adaptive["flags"]) <= set(SGLANG["flags"])
    assert "STANDALONE" not in adaptive["algorithms"]
    assert not any("adaptive" in arg for arg in sglang_args("/d", 4))
    plan = {
        "sweep": {"name": "s", "source": "outputs/s", "spec_key": "k", "test_set": "in_domain"},
        "target": {"name_or_path": "t", "architectures": ["X"], "vocab_size": 8},
        "rule": {"min_speedup": 1.0},
        "engines": {"vllm": VLLM_VERSION, "sglang": SGLANG_VERSION},
        "bands": [],
    }
    readme = export_readme(plan)
    assert "`--speculative-adaptive`" in readme and "STANDALONE" in readme
