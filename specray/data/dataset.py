"""A sweep's data, from its DataSpec: train / validation / in-domain test, and the out-of-domain test."""

from __future__ import annotations

from specray.config import DataSpec, SourceSpec
from specray.data.examples import Example
from specray.data.loaders import load_examples
from specray.data.splits import split_examples
from specray.data.synthetic import synthetic_corpus

SPLITS = ("train", "validation", "in_domain_test", "out_of_domain_test")


def load_source(source: SourceSpec) -> list[Example]:
    """Every usable example of one source (synthetic ones are generated, never downloaded)."""
    if source.kind == "synthetic":
        return synthetic_corpus(source.size, source.seed, source.families)
    assert source.path is not None  # guaranteed by SourceSpec's validator
    return load_examples(source.kind, source.path, split=source.split, columns=source.columns)


def build_splits(data: DataSpec) -> dict[str, list[Example]]:
    """Seeded, deterministic splits. Held-out splits are cut first so growing `train_size` never moves
    an example between test and train."""
    splits = split_examples(
        load_source(data.train),
        {
            "validation": data.validation_size,
            "in_domain_test": data.in_domain_test_size,
            "train": data.train_size,
        },
        seed=data.seed,
    )
    ood = split_examples(
        load_source(data.out_of_domain), {"out_of_domain_test": data.out_of_domain_test_size}, seed=data.seed
    )
    return {name: (splits | ood)[name] for name in SPLITS}
