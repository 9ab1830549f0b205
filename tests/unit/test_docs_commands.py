"""Commands the docs give for paths that cannot run here: their specs must at least validate.

docs/CLUSTER.md shows how sweeps/smollm2.yaml runs on a GPU cluster with the hub model and the vLLM
teacher; nothing here can run it, so this checks that the command's overrides make a valid spec that names
what the page says it does (a renamed setting would otherwise leave the page wrong unnoticed).
"""

from __future__ import annotations

import re
import shlex

from specray.config import load_spec
from tests.conftest import REPO


def fenced_command(page: str, heading: str) -> list[str]:
    """The words of the first fenced bash block under `heading` (line continuations joined)."""
    section = (REPO / page).read_text().split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, f"{page}: no command under '{heading}'"
    return shlex.split(block.group(1).replace("\\\n", " "))


def test_the_real_model_cluster_command_validates() -> None:
    words = fenced_command("docs/CLUSTER.md", "A real model on the cluster")
    assert words[:3] == ["specray", "submit", "sweeps/smollm2.yaml"]
    overrides = [w for w in words[3:] if "=" in w and not w.startswith("-")]
    spec = load_spec(REPO / words[2], overrides)
    assert spec.models.target.name_or_path == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert spec.models.draft.cut is not None  # the draft is still cut from the target
    assert spec.teacher.engine == "vllm" and spec.teacher.num_gpus == spec.teacher.vllm.tensor_parallel_size
    assert spec.distill.num_gpus_per_worker > 0 and spec.eval.num_gpus > 0
