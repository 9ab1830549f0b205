"""Speculative decoding: our decoder against HF assisted generation (CPU and GPU), the batch-aware model,
draft candidates for a real target."""
