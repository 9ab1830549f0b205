"""Serving by request temperature through HF assisted generation (serving/assisted.py): the band's draft
assists with its γ, a no-speculation band decodes with the target alone, and greedy output is the
target's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from specray.models.loading import load_model, load_tokenizer
from specray.serving.assisted import AssistedServer
from specray.serving.router import Router


@pytest.fixture(scope="module")
def server(micro_zoo, tmp_path_factory: pytest.TempPathFactory) -> AssistedServer:
    folder = tmp_path_factory.mktemp("export")
    bands = [
        {
            "low": 0.0,
            "high": 0.5,
            "alias": "tau-0",
            "route": "speculative",
            "draft": str(micro_zoo.draft),
            "gamma": 3,
        },
        {"low": 0.5, "high": None, "alias": "tau-1", "route": "none"},
    ]
    (folder / "routing.json").write_text(json.dumps({"bands": bands}))
    target = str(micro_zoo.target)
    return AssistedServer(
        Router.from_file(folder / "routing.json"), load_model(target), load_tokenizer(target)
    )


def test_greedy_requests_get_the_targets_own_output_with_the_draft_assisting(server) -> None:
    prompt = server.tokenizer("The cat sat on")["input_ids"]
    routed = server.generate(prompt, temperature=0.0, max_new_tokens=12)
    assert Path(server.router.route(0.0).draft_dir) in server.drafts  # the band's draft was used
    draft = server.drafts[Path(server.router.route(0.0).draft_dir)]
    assert draft.generation_config.num_assistant_tokens == 3  # γ, where HF reads it
    assert draft.generation_config.num_assistant_tokens_schedule == "constant"
    alone = server.target.generate(
        torch.tensor([prompt]), max_new_tokens=12, do_sample=False, eos_token_id=server.tokenizer.eos_token_id
    )
    assert routed == alone[0, len(prompt) :].tolist()  # lossless: speculative greedy = target greedy


def test_a_no_speculation_band_decodes_with_the_target_alone(server, monkeypatch) -> None:
    calls = []
    original = server.target.generate

    def spy(*args, **kwargs):
        calls.append(kwargs.get("assistant_model"))
        return original(*args, **kwargs)

    monkeypatch.setattr(server.target, "generate", spy)
    tokens = server.generate(
        server.tokenizer("Write a short poem")["input_ids"], temperature=0.9, max_new_tokens=8
    )
    assert calls == [None] and 0 < len(tokens) <= 8
