"""A sweep's data, from its DataSpec: train / validation / in-domain test, the out-of-domain test, and the
named test sets of `data.test_sets` (split `<name>_test`)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from specray.config import DataSpec, SourceSpec, TestSetSpec
from specray.data.examples import Example
from specray.data.spec_bench import load_questions, question_examples
from specray.data.splits import split_examples
from specray.data.synthetic import synthetic_corpus

SPLITS = ("train", "validation", "in_domain_test", "out_of_domain_test")


def held_out_split(test_set: str) -> str:
    """The split holding a test set's prompts: `in_domain` -> `in_domain_test`."""
    return f"{test_set}_test"


def load_source(source: SourceSpec) -> list[Example]:
    """Every usable example of one source (synthetic ones are generated, never downloaded)."""
    if source.kind == "synthetic":
        return synthetic_corpus(source.size, source.seed, source.families)
    assert source.path is not None  # guaranteed by SourceSpec's validator
    if source.kind == "spec_bench":
        return question_examples(load_questions(source.path, source.categories))
    # the file loaders here, not at the top: they are built on `datasets` (with pandas and pyarrow, about half
    # a second of imports), which a sweep on synthetic data never needs
    from specray.data.loaders import load_examples

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
    named = {held_out_split(name): _named_test_set(name, t, data.seed) for name, t in data.test_sets.items()}
    return {name: (splits | ood)[name] for name in SPLITS} | named


def _named_test_set(name: str, spec: TestSetSpec, seed: int) -> list[Example]:
    """`size` examples of the source drawn with the seed, or every one: in file order, or with a source's
    categories interleaved."""
    examples = load_source(spec.source)
    if spec.size is None:
        return interleave_categories(examples) if spec.source.has_categories else examples
    return split_examples(examples, {held_out_split(name): spec.size}, seed=seed)[held_out_split(name)]


def interleave_categories(examples: Sequence[Example]) -> list[Example]:
    """The first example of each category, then the second of each, and so on; each category keeps its
    order and the categories the order they first appear in. The empirical cells decode a test set's first
    prompts (`eval.empirical_prompts`): interleaved, those come from every category, not the file's first."""
    by_category: dict[str, list[Example]] = {}
    for e in examples:
        by_category.setdefault(e.family, []).append(e)
    rounds = itertools.zip_longest(*by_category.values())
    return [e for row in rounds for e in row if e is not None]
