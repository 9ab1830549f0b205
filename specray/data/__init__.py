"""Instruction data: examples, the Alpaca prompt templates, loaders, the synthetic corpus, splits."""
