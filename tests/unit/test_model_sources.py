"""Model sources beyond the zoo and a folder: GGUF files (refused in one line when specray cannot load them,
named entries resolved without a download) and drafts made from the target (cut and fresh), on tiny models.
The real packaged file is loaded in tests/integration/test_real_model.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from specray.config import CutSpec, FreshSpec
from specray.errors import ModelError
from specray.models.derived import cut, fresh, make_derived
from specray.models.gguf import check_gguf, value_sha256
from specray.models.loading import load_model
from specray.named_files import NAMED, missing_gguf_message


@pytest.fixture(scope="module")
def micro_zoo_2(tmp_path_factory: pytest.TempPathFactory):
    """The tests' micro zoo with a two-layer target (a cut needs a layer to leave out)."""
    from specray.config import TinyLlamaSpec
    from specray.models.zoo import build_zoo
    from tests.conftest import micro_zoo_spec

    shape = TinyLlamaSpec(
        hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, train_steps=4, lr=3e-3
    )
    return build_zoo(micro_zoo_spec(target=shape), root=tmp_path_factory.mktemp("zoo2"))


def write_gguf(path: Path, arch: str, qtype) -> Path:
    """A one-tensor GGUF file of `arch` whose tensor is stored as `qtype` (zeros)."""
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    writer = gguf.GGUFWriter(str(path), arch=arch)
    if qtype == gguf.GGMLQuantizationType.F32:
        writer.add_tensor("blk.0.attn_q.weight", np.zeros((2, 4), dtype=np.float32))
    else:
        writer.add_tensor("blk.0.attn_q.weight", np.zeros((1, nbytes), dtype=np.uint8), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_another_architecture_or_an_unknown_quantisation_is_one_line(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType as Q

    check_gguf(write_gguf(tmp_path / "ok.gguf", "llama", Q.Q4_1))  # what the packaged file holds
    with pytest.raises(ModelError, match=r"architecture 'gpt2' is not supported \(specray loads: llama\)"):
        check_gguf(write_gguf(tmp_path / "gpt2.gguf", "gpt2", Q.F32))
    with pytest.raises(ModelError, match="quantised as Q8_1, which the gguf package cannot dequantise"):
        check_gguf(write_gguf(tmp_path / "q81.gguf", "llama", Q.Q8_1))
    (tmp_path / "text.gguf").write_text("not a gguf file")
    with pytest.raises(ModelError, match="not a readable GGUF file"):
        check_gguf(tmp_path / "text.gguf")


def test_a_named_entry_is_known_without_its_file_and_an_unknown_name_lists_them(tmp_path: Path) -> None:
    assert value_sha256("smollm2-135m-instruct") == NAMED["smollm2-135m-instruct"].sha256
    assert "specray models fetch smollm2-135m-instruct" in (
        missing_gguf_message("smollm2-135m-instruct") or ""
    )
    assert "named entries: smollm2-135m-instruct" in (missing_gguf_message("smollm3") or "")
    assert missing_gguf_message(str(tmp_path / "absent.gguf")).endswith("file not found")


def test_a_cut_draft_keeps_the_targets_first_layers_embeddings_and_head(micro_zoo_2) -> None:
    target = load_model(str(micro_zoo_2.target), "float32")
    draft = cut(target, 1)
    assert draft.config.num_hidden_layers == 1 and len(draft.model.layers) == 1
    for name, weight in draft.state_dict().items():  # every kept tensor is the target's own
        assert torch.equal(weight, target.state_dict()[name]), name
    ids = torch.tensor([[1, 5, 7, 9]])
    with torch.no_grad():  # the cut equals the target run through its first layer only
        hidden = target.model(input_ids=ids, output_hidden_states=True).hidden_states[1]
        expected = target.lm_head(target.model.norm(hidden))
        assert torch.allclose(draft(input_ids=ids).logits, expected, atol=1e-5)
    with pytest.raises(ModelError, match="between 1 and 1"):
        cut(target, 2)


def test_a_fresh_draft_has_the_targets_vocabulary_and_its_embeddings_where_widths_agree(micro_zoo_2) -> None:
    target = load_model(str(micro_zoo_2.target), "float32")
    width = target.config.hidden_size
    same = fresh(target, FreshSpec(hidden_size=width, num_layers=1, num_heads=2, intermediate_size=16))
    assert same.config.vocab_size == target.config.vocab_size
    assert torch.equal(same.get_input_embeddings().weight, target.get_input_embeddings().weight)
    narrow = fresh(target, FreshSpec(hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16, seed=1))
    assert narrow.get_input_embeddings().weight.shape == (target.config.vocab_size, 8)


def test_a_derived_draft_is_made_once_with_the_targets_tokenizer(micro_zoo_2, tmp_path: Path) -> None:
    from specray.models.loading import load_tokenizer

    folder = tmp_path / "cut-x"
    made = make_derived(folder, str(micro_zoo_2.target), CutSpec(layers=1), {"target": "t"})
    assert (made / "derived.json").is_file() and (made / "tokenizer.json").is_file()
    stamp = (made / "model.safetensors").stat().st_mtime_ns
    assert make_derived(folder, str(micro_zoo_2.target), CutSpec(layers=1), {"target": "t"}) == made
    assert (made / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not made again
    target_vocab = load_tokenizer(str(micro_zoo_2.target)).get_vocab()
    assert load_tokenizer(str(made)).get_vocab() == target_vocab


def test_preflight_refuses_a_cut_of_every_layer_and_a_file_it_cannot_load(tmp_path: Path) -> None:
    """Before any work: the zoo target of sweeps/smoke.yaml has 2 layers; a gpt2 GGUF target is refused."""
    from gguf import GGMLQuantizationType as Q

    from specray.config import load_spec
    from specray.errors import SpecError
    from specray.sweep.preflight import preflight
    from tests.conftest import REPO

    smoke = REPO / "sweeps" / "smoke.yaml"
    out = f"output_dir={tmp_path}"
    with pytest.raises(SpecError, match=r"models.draft.cut.layers: 2 keeps every layer of the target \(2\)"):
        preflight(load_spec(smoke, [out, "models.draft={cut: {layers: 2}}"]))
    preflight(load_spec(smoke, [out, "models.draft={cut: {layers: 1}}"]))
    gpt2 = write_gguf(tmp_path / "gpt2.gguf", "gpt2", Q.F32)
    with pytest.raises(ModelError, match="architecture 'gpt2' is not supported"):
        preflight(load_spec(smoke, [out, f"models.target={{gguf: {gpt2}}}"]))
