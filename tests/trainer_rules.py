"""The EAGLE-3 trainers' checks of their data files, restated from their code (`specray export-data`'s tests):
- SpecForge (sgl-project/SpecForge 0.2.0, `scripts/conversation_validation.py: validate_conversation` and
  `scripts/validate_regenerated_data.py: validate_row`): a non-empty list of messages; each content a
  non-empty string after stripping; `system` only before the first user turn; otherwise roles `user` and
  `assistant` only, alternating, starting with `user`; at least one user message; a regenerated row has a
  non-empty string `id`, unique in its file, `status == "success"`, and ends with an assistant message.
- speculators (vllm-project/speculators v0.7.0.1, `scripts/response_regeneration/script.py` writes the rows,
  `scripts/prepare_data.py` reads them with `datasets.load_dataset("json", ...)` and passes `input_ids` /
  `loss_mask` through): the two lists have the same length, the mask is 0 over the prompt and 1 over the
  generated tokens, a row has at least one supervised token; `metadata.sampling_params` holds the request's
  sampling parameters.
"""

from __future__ import annotations

import json
from pathlib import Path


def specforge_problems(path: Path) -> list[str]:
    """SpecForge's checks of a regenerated data file (see the module docstring)."""
    problems, seen = [], set()
    for number, line in enumerate(path.read_text().splitlines(), 1):
        row = json.loads(line)
        where = f"line {number}"
        if not isinstance(row.get("id"), str) or not row["id"].strip():
            problems.append(f"{where}: id must be a non-empty string")
        if row.get("id") in seen:
            problems.append(f"{where}: duplicate id {row['id']}")
        seen.add(row.get("id"))
        if row.get("status") != "success":
            problems.append(f"{where}: status must be 'success'")
        messages = row.get("conversations")
        if not isinstance(messages, list) or not messages:
            problems.append(f"{where}: conversations must be a non-empty list")
            continue
        expected, saw_user = "user", False
        for index, message in enumerate(messages):
            content, role = message.get("content"), message.get("role")
            if not isinstance(content, str) or not content.strip():
                problems.append(f"{where}: message {index} content must be a non-empty string")
            if role == "system" and not saw_user:
                continue
            if role not in {"user", "assistant"} or role != expected:
                problems.append(f"{where}: message {index} has role {role!r}, expected {expected!r}")
            saw_user = True
            expected = "assistant" if role == "user" else "user"
        if not saw_user:
            problems.append(f"{where}: conversation has no user message")
        if messages[-1].get("role") != "assistant":
            problems.append(f"{where}: conversation must end with an assistant message")
    return problems


def speculators_problems(path: Path) -> list[str]:
    """speculators' pass-through of pre-tokenised rows, loaded as its prepare_data.py loads them."""
    from datasets import load_dataset

    rows = load_dataset("json", data_files=str(path), split="train")
    problems = []
    for row in rows:
        ids, mask = row["input_ids"], row["loss_mask"]
        if len(ids) != len(mask):
            problems.append(f"{row['id']}: input_ids and loss_mask lengths differ")
        prompt = row["metadata"]["usage"]["prompt_tokens"]
        if mask != [0] * prompt + [1] * (len(ids) - prompt) or sum(mask) == 0:
            problems.append(f"{row['id']}: loss_mask is not 0 over the prompt and 1 over the response")
        if row["metadata"]["sampling_params"]["temperature"] != row["metadata"]["tau_kd"]:
            problems.append(f"{row['id']}: sampled at another temperature than its τ_kd")
    return problems
