"""Serving by request temperature through transformers' assisted generation, with the exported drafts.

    router = Router.from_file("export/routing.json")
    server = AssistedServer(router, load_model(target_path), load_tokenizer(target_path))
    token_ids = server.generate(prompt_ids, temperature=0.8, max_new_tokens=128)

Each request is routed by its temperature (`Router.route`): its band's draft proposes γ tokens per step, or
the target decodes alone in a "no speculation" band. The batch size plays no part: transformers' assisted
generation decodes one sequence at a time, so every request is routed as a batch of 1 (`Router.route(τ)`,
the γ of the band's smallest batch size) and routing.json's per-batch γ, meant for batching servers (vLLM),
is not used here. The draft is configured the way transformers 5.x reads
it (specdec/hf_compare.py: γ and a constant schedule on the draft's own generation_config, no confidence
threshold, the temperature warper applied once, top-k off), so HF does the speculative sampling the routing
plan's figures describe.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specray.models.loading import load_model
from specray.serving.router import Router
from specray.specdec.hf_compare import Comparison, assisted_kwargs, configure_assistant

if TYPE_CHECKING:
    from specray.models.loading import CausalLM


class AssistedServer:
    """A target and the drafts of an export, loaded once each (drafts on first use)."""

    def __init__(self, router: Router, target: CausalLM, tokenizer: PreTrainedTokenizerBase):
        self.router, self.target, self.tokenizer = router, target, tokenizer
        self.drafts: dict[Path, PreTrainedModel] = {}

    def draft(self, folder: Path) -> PreTrainedModel:
        if folder not in self.drafts:
            dtype = str(self.target.dtype).removeprefix("torch.")  # the target's, as the sweep evaluated it
            self.drafts[folder] = load_model(str(folder), dtype, device=self.target.device)
        return self.drafts[folder]

    @torch.no_grad()
    def generate(
        self, prompt_ids: list[int], temperature: float, max_new_tokens: int, seed: int = 0
    ) -> list[int]:
        """New token ids for one request (batch size 1, as assisted generation requires: routed as such)."""
        route = self.router.route(temperature, batch_size=1)
        request = Comparison(
            temperature,
            route.gamma or 1,
            max_new_tokens,
            self.tokenizer.eos_token_id,
            (tuple(prompt_ids),),
            (seed,),
            self.tokenizer.pad_token_id,
        )
        kwargs = assisted_kwargs(request)
        if route.draft_dir is not None:
            draft = self.draft(route.draft_dir)
            configure_assistant(draft, request)
            kwargs["assistant_model"] = draft
        torch.manual_seed(seed)
        input_ids = torch.tensor([prompt_ids], device=self.target.device)
        out = self.target.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
        return out[0, len(prompt_ids) :].tolist()
