"""Distillation: training throughput, convergence, and what Ray Train adds per draft and per run."""
