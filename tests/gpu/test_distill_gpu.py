"""One online KD step on CUDA the way the train loop takes it: on-policy student samples (CUDA generators,
bf16 autocast), the chunked loss under bf16 autocast, backward and an AdamW step on fp32 master weights,
then the acceptance probe (the analytic estimator at several τ_dec, τ_dec > 0 included) on the GPU."""

from __future__ import annotations

import pytest
import torch

from specray.devices import Resources, autocast
from specray.distill.data import TrainRow, collate
from specray.distill.losses import ResponseLoss
from specray.distill.probe import AcceptanceProbe
from specray.models.loading import load_model
from specray.sampling import sample_batch

TAU_KD, NEW_TOKENS, CHUNK = 1.0, 24, 32


def test_an_online_kd_step_with_the_probe_on_cuda(pair_dirs, cuda_pair, prompts) -> None:
    teacher, _ = cuda_pair
    device = Resources(1.0, 1.0).torch_device()  # a distill worker with num_gpus_per_worker: 1
    student = load_model(str(pair_dirs.draft), "float32", device=device).train()  # fp32 master weights
    before = [p.detach().clone() for p in student.parameters()]

    student.eval()  # on-policy responses, as `loop._with_student_samples` draws them
    generators = [torch.Generator(device=device).manual_seed(i) for i in range(len(prompts))]
    with autocast(device):
        samples = sample_batch(student, prompts, [TAU_KD] * len(prompts), generators, NEW_TOKENS, {2}, 0)
    student.train()
    rows = [TrainRow(tuple(p), tuple(s.token_ids), TAU_KD) for p, s in zip(prompts, samples, strict=True)]
    batch = collate(rows, pad_token_id=0).to(device)
    inputs = (batch.input_ids, batch.attention_mask, batch.labels)

    chunked = ResponseLoss("fkl", chunk_size=CHUNK)
    assert chunked.units(batch.labels) > CHUNK  # the chunked path, not the plain one
    with autocast(device):
        loss = chunked(student, teacher, *inputs)
    (loss / chunked.units(batch.labels)).backward()
    grads = [p.grad for p in student.parameters() if p.grad is not None]
    assert torch.isfinite(loss) and loss > 0
    assert grads and all(torch.isfinite(g).all() for g in grads) and any(g.abs().sum() > 0 for g in grads)
    with torch.no_grad(), autocast(device):  # chunking changes nothing but memory (bf16 round-off aside)
        plain = ResponseLoss("fkl")(student, teacher, *inputs)
    assert float(plain) == pytest.approx(loss.item(), rel=2e-2)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    optimizer.step()
    assert any(not torch.equal(p, b) for p, b in zip(student.parameters(), before, strict=True))

    probe = AcceptanceProbe(teacher, prompts[:4], [0.0, 0.6, 1.0], 16, 2, 0)  # the loop's rank-0 probe
    acceptance, per_prompt = probe(student)
    assert set(acceptance) == {0.0, 0.6, 1.0}
    assert all(0.0 <= value <= 1.0 for value in acceptance.values()), acceptance
    assert len(per_prompt[1.0].tokens) == 4  # per probe prompt, for the report's bootstrap
    assert student.training  # the probe restores train mode
    same, _ = probe(teacher)  # draft == target
    assert all(same[t] == pytest.approx(1.0, abs=1e-4) for t in (0.0, 0.6, 1.0))
