"""The tiny zoo and model loading: cache hits, atomic builds, safetensors only, vocabulary checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from specray.config import ModelRef, ModelsSpec, ZooSpec
from specray.models import zoo as zoo_module
from specray.models.loading import ModelError, check_same_vocabulary, load_model, load_tokenizer
from specray.models.sources import load_pair
from specray.models.zoo import build_model, build_zoo, packed_tokens, zoo_key
from tests.conftest import micro_zoo_spec


def test_default_zoo_sizes_match_the_recipe() -> None:
    """Target ≈5–20M parameters, draft ≈0.3–1M: the scale gap of Llama-2-13B vs llama-68m, shrunk."""
    spec = ZooSpec()
    tokenizer = zoo_module.train_tokenizer(
        zoo_module.corpus_texts(spec.model_copy(update={"corpus_size": 500})), spec.vocab_size
    )
    target = sum(p.numel() for p in build_model(spec.target, tokenizer, spec.seq_len).parameters())
    draft = sum(p.numel() for p in build_model(spec.draft, tokenizer, spec.seq_len).parameters())
    assert 5e6 <= target <= 20e6
    assert 0.3e6 <= draft <= 1e6


def test_micro_zoo_has_hf_dirs_with_safetensors_and_tokenizer(micro_zoo) -> None:
    for model_dir in (micro_zoo.target, micro_zoo.draft):
        assert (model_dir / "model.safetensors").exists()
        assert (model_dir / "tokenizer.json").exists()
        assert not list(model_dir.glob("*.bin"))  # no pickle weights
    info = micro_zoo.info
    assert info["models"]["target"]["parameters"] > info["models"]["draft"]["parameters"]
    assert info["corpus_tokens"] > 0


def test_second_build_is_a_cache_hit(micro_zoo, monkeypatch: pytest.MonkeyPatch) -> None:
    def rebuilt(*args, **kwargs):
        raise AssertionError("a cache hit trained something")

    monkeypatch.setattr(zoo_module, "train_tokenizer", rebuilt)
    monkeypatch.setattr(zoo_module, "pretrain", rebuilt)
    written = (micro_zoo.root / "zoo.json").stat().st_mtime_ns
    again = build_zoo(micro_zoo_spec(), root=micro_zoo.root.parent)
    assert again.cached and again.root == micro_zoo.root
    assert (micro_zoo.root / "zoo.json").stat().st_mtime_ns == written


def test_cache_key_follows_the_recipe() -> None:
    assert zoo_key(micro_zoo_spec()) == zoo_key(micro_zoo_spec())
    assert zoo_key(micro_zoo_spec()) != zoo_key(micro_zoo_spec(seed=1))


def test_tokenizer_prepends_bos_and_round_trips_any_text(micro_zoo) -> None:
    tokenizer = load_tokenizer(str(micro_zoo.target))
    text = "### Response:\nünïcode ✓ 12 + 30 = 42"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text


def test_packed_stream_separates_documents_with_eos(micro_zoo) -> None:
    tokenizer = load_tokenizer(str(micro_zoo.target))
    stream = packed_tokens(["a b", "c"], tokenizer)
    assert (stream == tokenizer.eos_token_id).sum() == 2
    assert (stream == tokenizer.bos_token_id).sum() == 2


def test_build_is_deterministic(tmp_path: Path) -> None:
    spec = micro_zoo_spec(corpus_size=120)
    first = build_zoo(spec, root=tmp_path / "a")
    second = build_zoo(spec, root=tmp_path / "b")
    a, b = load_model(str(first.draft)), load_model(str(second.draft))
    for (name, p), q in zip(a.named_parameters(), b.parameters(), strict=False):
        assert torch.equal(p, q), name


def test_pre_training_progress_in_a_log_is_plain_lines(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    build_zoo(micro_zoo_spec(corpus_size=100), root=tmp_path)  # stderr is captured: not a terminal
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "zoo: pre-train target" in line]
    assert "\r" not in err and len(lines) >= 2, err  # tqdm's bar would redraw one line with \r
    assert "steps (100%)" in lines[-1] and "loss " in lines[-1] and lines[-1].endswith("done")


def test_killed_build_leaves_no_zoo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if the user pressed Ctrl-C mid-training

    monkeypatch.setattr(zoo_module, "pretrain", crash)
    with pytest.raises(KeyboardInterrupt):
        build_zoo(micro_zoo_spec(corpus_size=100), root=tmp_path)
    # only the zoo's lock file stays (a lock file is never removed: a waiter may hold it open)
    assert [path.name for path in tmp_path.iterdir() if not path.name.endswith(".lock")] == []


def test_load_pair_through_paths_and_vocab_mismatch(micro_zoo, tmp_path: Path) -> None:
    models = ModelsSpec(
        target=ModelRef(name_or_path=str(micro_zoo.target)), draft=ModelRef(name_or_path=str(micro_zoo.draft))
    )
    target, draft, tokenizer = load_pair(models)
    assert target.config.vocab_size == draft.config.vocab_size == len(tokenizer)
    assert not target.training

    other = build_zoo(micro_zoo_spec(vocab_size=300, corpus_size=100), root=tmp_path)
    with pytest.raises(ModelError, match="different vocabularies"):
        check_same_vocabulary(
            load_tokenizer(str(micro_zoo.target)), load_tokenizer(str(other.draft)), "t", "d"
        )
    mixed = ModelsSpec(target=models.target, draft=ModelRef(name_or_path=str(other.draft)))
    with pytest.raises(ModelError, match="speculative decoding needs one shared tokenizer"):
        load_pair(mixed)


def test_missing_or_pickle_only_model_dirs_are_refused(micro_zoo, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="model directory not found"):
        load_model(str(tmp_path / "nope"))
    pickle_only = tmp_path / "pickle_only"
    pickle_only.mkdir()
    (pickle_only / "config.json").write_text((micro_zoo.draft / "config.json").read_text())
    torch.save({}, pickle_only / "pytorch_model.bin")
    with pytest.raises(ModelError, match="safetensors only"):
        load_model(str(pickle_only))
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "config.json").write_text((micro_zoo.draft / "config.json").read_text())
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelError, match="cannot load the model"):
        load_model(str(corrupt))


def test_a_zoo_that_changes_only_the_draft_copies_the_target(tmp_path: Path, monkeypatch) -> None:
    """Per-model keys: the second zoo pre-trains its draft only, and its target is the first zoo's; a
    changed target recipe (seed) is not reused."""
    spec = micro_zoo_spec(corpus_size=120)
    first = build_zoo(spec, root=tmp_path)
    trained: list[str] = []
    pretrain = zoo_module.pretrain
    monkeypatch.setattr(
        zoo_module,
        "pretrain",
        lambda m, s, shape, z, name: trained.append(name) or pretrain(m, s, shape, z, name),
    )
    wider = spec.model_copy(
        update={
            "draft": spec.draft.model_copy(update={"intermediate_size": spec.draft.intermediate_size + 8})
        }
    )
    second = build_zoo(wider, root=tmp_path)
    assert trained == ["draft"] and second.root != first.root
    assert second.info["models"]["target"]["copied_from"] == first.root.name
    for p, q in zip(
        load_model(str(first.target)).parameters(), load_model(str(second.target)).parameters(), strict=True
    ):
        assert torch.equal(p, q)
    build_zoo(wider.model_copy(update={"seed": 1}), root=tmp_path)
    assert trained == ["draft", "target", "draft"]


def test_model_keys_ignore_the_other_model() -> None:
    spec = micro_zoo_spec()
    wider = spec.model_copy(
        update={
            "draft": spec.draft.model_copy(update={"intermediate_size": spec.draft.intermediate_size + 8})
        }
    )
    assert zoo_module.model_key(spec, "target") == zoo_module.model_key(wider, "target")
    assert zoo_module.model_key(spec, "draft") != zoo_module.model_key(wider, "draft")
    assert zoo_module.model_key(spec, "target") != zoo_module.model_key(spec, "draft")
