"""A draft's MLflow model as a thin pyfunc: the HF folder as specray wrote it, loaded by this module.

    model = mlflow.pyfunc.load_model("models:/<model id>")   # the id is in the run's Models column
    model.predict(["Give three tips for staying healthy."])   # -> ["1. Eat ...", ...] (greedy)
    model.predict(prompts, params={"temperature": 0.8, "max_new_tokens": 64})

Not `mlflow.transformers`: MLflow 3.17's transformers flavour fails on a local checkpoint under
transformers 5.23 (`build_flavor_config_from_local_checkpoint` takes `__name__` of the pipeline registry's
`impl`, which transformers 5 keeps as a string), and it would write a second copy of the weights. The
folder also loads as it is: `transformers.AutoModelForCausalLM.from_pretrained(<downloaded>/draft)`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


class DraftGenerator:
    """Generates a response per prompt with the draft (prompts as the model was trained on them)."""

    def __init__(self, folder: str) -> None:
        from specray.models.loading import load_model, load_tokenizer

        self.tokenizer = load_tokenizer(folder)
        self.model = load_model(folder)

    def predict(self, model_input: Any, params: Mapping[str, Any] | None = None) -> list[str]:
        """`model_input`: a prompt, a list of prompts, or a DataFrame whose first column holds them."""
        from specray.models.loading import decode_text

        params = dict(params or {})
        tau, max_new_tokens = float(params.get("temperature", 0.0)), int(params.get("max_new_tokens", 48))
        sampling = {"do_sample": True, "temperature": tau, "top_k": 0} if tau > 0 else {"do_sample": False}
        responses = []
        for prompt in _prompts(model_input):
            input_ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]  # [1, prompt]
            with torch.no_grad():
                output = self.model.generate(
                    input_ids,
                    max_new_tokens=max_new_tokens,
                    pad_token_id=self.tokenizer.pad_token_id,
                    **sampling,
                )
            responses.append(decode_text(self.tokenizer, output[0, input_ids.shape[1] :]))
        return responses


def _prompts(model_input: Any) -> Sequence[str]:
    if isinstance(model_input, str):
        return [model_input]
    if hasattr(model_input, "iloc"):  # a pandas DataFrame, as MLflow's serving passes inputs
        return [str(value) for value in model_input.iloc[:, 0]]
    return [str(value) for value in model_input]


def _load_pyfunc(data_path: str) -> DraftGenerator:
    """MLflow's entry point for the `python_function` flavour; `data_path` is the model's `draft/` folder."""
    return DraftGenerator(data_path)
