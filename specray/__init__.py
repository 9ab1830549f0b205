"""specray: temperature-centric knowledge distillation sweeps for speculative decoding, on Ray."""

__version__ = "0.1.0"
