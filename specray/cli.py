"""The `specray` command line. Each subcommand validates its spec before doing any work."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from specray.config import ZooSpec, dump_spec, load_spec
from specray.errors import USER_ERRORS

app = typer.Typer(
    help="Temperature-centric knowledge distillation sweeps for speculative decoding, on Ray.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
zoo_app = typer.Typer(
    help="The tiny model zoo: tokenizer, target and draft trained locally.", no_args_is_help=True
)
data_app = typer.Typer(help="Inspect a sweep's data: sources, splits and prompts.", no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")
app.add_typer(data_app, name="data")

SweepArg = typer.Argument(..., help="Sweep YAML, e.g. sweeps/tiny.yaml.", exists=False)
OverridesArg = typer.Argument(None, help="KEY=VALUE overrides, e.g. eval.gamma=3 teacher.replicas=2.")


@contextmanager
def user_errors() -> Iterator[None]:
    """User mistakes (bad spec, data or model) end with one clear message and exit code 2, no traceback."""
    try:
        yield
    except USER_ERRORS as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log debug messages.")) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )


@app.command()
def validate(sweep: Path = SweepArg, overrides: list[str] = OverridesArg) -> None:
    """Validate a sweep spec and print it fully resolved (includes, defaults and overrides applied)."""
    with user_errors():
        spec = load_spec(sweep, overrides or [])
    typer.echo(dump_spec(spec), nl=False)


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
    _set_threads()
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


def _show_samples(model_dir: Path, n: int) -> None:
    from specray.data.synthetic import IN_DOMAIN, OUT_OF_DOMAIN, synthetic_corpus
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


def _set_threads() -> None:
    import os

    import torch

    torch.set_num_threads(max(1, int(os.environ.get("SPECRAY_THREADS", os.cpu_count() or 1))))
