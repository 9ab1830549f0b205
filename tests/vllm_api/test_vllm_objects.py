"""specray's vLLM settings, built into vLLM's own objects by the real vLLM (the version in
scripts/setup_vllm_api.sh), on a CPU machine: `make test-vllm-api`.

vLLM cannot run a model here, but its configuration classes validate on the CPU platform: sampling
parameters, the engine arguments `vllm.LLM(...)` receives, and the `--speculative-config` an export writes,
parsed by `vllm serve`'s own argument parser and bound to `SpeculativeConfig` against a real (tiny) target.
Skipped where vLLM is not importable, i.e. in the default lane.
"""

from __future__ import annotations

import inspect
import json
import os
import shlex
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="the vLLM API lane: make test-vllm-api")
os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")  # vLLM's config classes need a platform to bind to

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import ParallelConfig, SpeculativeConfig  # noqa: E402
from vllm.engine.arg_utils import EngineArgs  # noqa: E402
from vllm.exceptions import VLLMValidationError  # noqa: E402
from vllm.utils.argparse_utils import FlexibleArgumentParser  # noqa: E402
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup  # noqa: E402

from specray.config import VllmSpec, vllm_accepts_temperature  # noqa: E402
from specray.serving.engines import VLLM_VERSION, vllm_launch, vllm_speculative_config  # noqa: E402
from specray.serving.export import band_entry, write_engines  # noqa: E402
from specray.serving.plan import plan_batched  # noqa: E402
from specray.serving.router import Router  # noqa: E402
from specray.teacher.generation import GenerationRequest  # noqa: E402
from specray.teacher.vllm_engine import llm_kwargs, to_sampling_kwargs  # noqa: E402
from tests.unit.test_serving_router import sweep_at_three_batch_sizes  # noqa: E402


def test_the_lane_runs_the_vllm_version_the_export_names() -> None:
    assert vllm.__version__ == VLLM_VERSION


@pytest.mark.parametrize("tau", [0.0, 0.001, 0.0099, 0.01, 0.1, 0.7, 1.0, 1.5, 2.0, 2.01, 3.0, 5.0])
def test_vllm_samples_at_exactly_the_temperatures_the_config_lets_through(tau: float) -> None:
    kwargs = to_sampling_kwargs(GenerationRequest("p-1", "x", tau, 3, 16))
    try:
        params = SamplingParams(**kwargs)
    except (ValueError, VLLMValidationError):
        kept = False  # vLLM rejects it
    else:
        kept = params.temperature == tau  # vLLM may raise a small τ silently
        assert (params.top_p, params.min_p, params.seed, params.max_tokens) == (1.0, 0.0, kwargs["seed"], 16)
        assert params.top_k in (0, -1)  # vLLM's "no top-k" (it normalises the value)
    assert kept is vllm_accepts_temperature(tau), f"τ = {tau}: vLLM kept it: {kept}"


def test_every_llm_keyword_specray_passes_is_an_engine_argument(micro_zoo) -> None:
    spec = VllmSpec(tensor_parallel_size=2, dtype="float32", max_model_len=256)
    kwargs = llm_kwargs(str(micro_zoo.target), spec, seed=5, trust_remote_code=False)
    # vllm.LLM(**kwargs) hands every keyword it does not name itself to EngineArgs
    named = set(inspect.signature(LLM.__init__).parameters)
    fields = set(EngineArgs.__dataclass_fields__)
    assert set(kwargs) <= named | fields, sorted(set(kwargs) - named - fields)
    engine = EngineArgs(**kwargs)
    model_config = engine.create_model_config()
    assert (model_config.max_model_len, str(model_config.dtype)) == (256, "torch.float32")
    assert engine.tensor_parallel_size == 2 and engine.distributed_executor_backend == "ray"


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_the_exported_speculative_config_is_what_vllm_serve_builds(micro_zoo, gamma: int) -> None:
    config = vllm_speculative_config(str(micro_zoo.draft), gamma)
    argv = shlex.split(vllm_launch(str(micro_zoo.target), config))
    assert argv[:3] == ["vllm", "serve", str(micro_zoo.target)]
    speculative = _bind(str(micro_zoo.target), argv[3:])
    assert speculative.method == "draft_model" and speculative.model == str(micro_zoo.draft)
    assert speculative.num_speculative_tokens == gamma
    assert speculative.draft_sample_method == "probabilistic"


def test_a_misspelled_field_is_refused_by_vllm(micro_zoo) -> None:
    """The lane can fail: vLLM's SpeculativeConfig refuses a key it does not have."""
    config = {**vllm_speculative_config(str(micro_zoo.draft), 3), "num_speculative_tokenz": 3}
    with pytest.raises(ValueError, match="num_speculative_tokenz"):
        _bind(str(micro_zoo.target), ["--speculative-config", json.dumps(config)])


def test_the_exported_gamma_per_batch_size_is_what_vllm_schedules(micro_zoo, tmp_path: Path) -> None:
    """An export of a sweep at B 1, 4, 16: each band's vllm/<band>.json, bound by `vllm serve`'s parser to
    SpeculativeConfig, and vLLM's own batch size -> γ lookup, agree with the router at every batch size."""
    plans = plan_batched(sweep_at_three_batch_sizes())
    bands = [band_entry(p, {"key-a": "a", "key-b": "b"}) for p in plans]
    for folder in ("a", "b"):  # the exported draft folders: the micro zoo's draft
        (tmp_path / "drafts").mkdir(exist_ok=True)
        (tmp_path / "drafts" / folder).symlink_to(micro_zoo.draft)
    plan = {"target": {"name_or_path": str(micro_zoo.target)}, "bands": bands}
    write_engines(plan, tmp_path)
    (tmp_path / "routing.json").write_text(json.dumps(plan))
    router = Router.from_file(tmp_path / "routing.json")
    checked = 0
    for band in bands:
        path = tmp_path / "vllm" / f"{band['alias']}.json"
        if band["route"] != "speculative":
            assert not path.exists()
            continue
        config = json.loads(path.read_text())
        speculative = _bind(str(micro_zoo.target), ["--speculative-config", json.dumps(config)])
        assert speculative.uses_dynamic_speculative_decoding()
        schedule = speculative.num_speculative_tokens_per_batch_size
        assert [list(entry) for entry in schedule] == config["num_speculative_tokens_per_batch_size"]
        lookup = build_dynamic_sd_schedule_lookup(schedule, 64, speculative.num_speculative_tokens)
        for b in range(1, 65):
            route = router.route(band["tau_decs"][0], b)
            assert lookup[b] == (route.gamma or 0), (band["alias"], b)
        checked += 1
    assert checked == 2  # the bands of τ_dec 0.2 (γ 4, 4, 2) and 0.8 (γ 4, 0, 0)


def test_vllm_refuses_a_schedule_that_does_not_start_at_one(micro_zoo) -> None:
    """The lane can fail: vLLM's lookup refuses a schedule with batch sizes it does not cover."""
    config = vllm_speculative_config(str(micro_zoo.draft), 3, [(1, 4, 3), (4, None, 1)])
    config["num_speculative_tokens_per_batch_size"][0][0] = 2
    speculative = _bind(str(micro_zoo.target), ["--speculative-config", json.dumps(config)])
    with pytest.raises(ValueError, match="must start at 1"):
        build_dynamic_sd_schedule_lookup(speculative.num_speculative_tokens_per_batch_size, 64, 3)


def _bind(target: str, extra_args: list[str]) -> SpeculativeConfig:
    """`vllm serve`'s parse of the arguments, then vLLM's own binding of the speculative config."""
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    engine = EngineArgs.from_cli_args(parser.parse_args(["--model", target, *extra_args]))
    speculative = engine.create_speculative_config(engine.create_model_config(), ParallelConfig())
    assert speculative is not None
    return speculative


def test_the_zoo_is_a_local_folder(micro_zoo) -> None:
    assert Path(micro_zoo.target, "config.json").is_file()
