"""`specray bench`: Spec-Bench's protocol (question file in, two answer files and its speed figures out)."""

from __future__ import annotations

from pathlib import Path

import typer

from specray.cli.common import app, set_threads, user_errors


@app.command("bench")
def bench(
    questions: Path = typer.Argument(..., help="Spec-Bench question file (question.jsonl)."),
    target: str | None = typer.Option(None, "--target", help="Target model: HF dir or name."),
    draft: str | None = typer.Option(None, "--draft", help="Draft model: HF dir or name (or use --routing)."),
    gamma: int = typer.Option(4, "--gamma", min=1, help="Draft tokens per step with --draft."),
    routing: Path | None = typer.Option(
        None, "--routing", help="routing.json of `specray export`: draft and γ by request temperature."
    ),
    zoo: bool = typer.Option(False, "--zoo", help="Target and draft of the tiny zoo (built if not cached)."),
    temperature: float | None = typer.Option(
        None, "--temperature", min=0.0, max=2.0, help="One request temperature for every question."
    ),
    workload: str | None = typer.Option(
        None, "--workload", help="Per-category request temperatures: a preset (mt_bench)."
    ),
    categories: str | None = typer.Option(
        None,
        "--categories",
        help="Categories or groups (mt_bench), comma-separated; default: all.",
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Questions per category at most."),
    max_new_tokens: int = typer.Option(128, "--max-new-tokens", min=1, help="New tokens per turn at most."),
    num_choices: int = typer.Option(1, "--num-choices", min=1, help="Answers per question (seeds 0..n-1)."),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(Path("bench"), "--out", help="Folder of the two answer files."),
) -> None:
    """Answer a Spec-Bench question file with speculative decoding and with the target alone (same seeds,
    the target's chat template, each category at its request temperature); write both answer files in
    Spec-Bench's format and print its figures per category: mean accepted tokens, tokens/s, speedup."""
    from specray.data.spec_bench import load_questions

    with user_errors():
        wanted = [c.strip() for c in categories.split(",") if c.strip()] if categories is not None else None
        chosen = _limited(load_questions(questions, wanted), limit)
        models = _models(target, draft, zoo)
        temperatures = _temperatures([q.category for q in chosen], temperature, workload)
        choices = _choices(temperatures, models[1], gamma, routing)
        tokenizer = _tokenizer(*models)
    set_threads()
    _run(chosen, models[0], tokenizer, temperatures, choices, max_new_tokens, seed, num_choices, out)


def _limited(questions: list, limit: int | None) -> list:
    if limit is None:
        return questions
    seen: dict[str, int] = {}
    kept = []
    for question in questions:
        seen[question.category] = seen.get(question.category, 0) + 1
        if seen[question.category] <= limit:
            kept.append(question)
    return kept


def _models(target: str | None, draft: str | None, zoo: bool) -> tuple[str, str | None]:
    from specray.errors import SpecError

    if zoo:
        if target or draft:
            raise SpecError("--zoo takes the tiny zoo's target and draft; leave out --target and --draft")
        from specray.config import ZooSpec
        from specray.models.zoo import build_zoo

        built = build_zoo(ZooSpec())
        return str(built.target), str(built.draft)
    if not target:
        raise SpecError("--target is required (or --zoo for the tiny zoo)")
    return target, draft


def _temperatures(categories: list[str], temperature: float | None, workload: str | None) -> dict[str, float]:
    from specray.data.spec_bench import workload_temperatures
    from specray.errors import SpecError

    present = list(dict.fromkeys(categories))
    if (temperature is None) == (workload is None):
        raise SpecError("give one of --temperature (every question) or --workload (per category: mt_bench)")
    if workload is not None:
        return workload_temperatures(workload, present, "--workload")
    assert temperature is not None
    return dict.fromkeys(present, float(temperature))


def _choices(temperatures: dict[str, float], draft: str | None, gamma: int, routing: Path | None) -> dict:
    from specray.errors import SpecError
    from specray.serving.bench import Choice
    from specray.serving.router import Router

    if (draft is None) == (routing is None):
        raise SpecError("give one of --draft (with --gamma) or --routing (an export's routing.json)")
    if routing is None:
        return {c: Choice(draft, gamma) for c in temperatures}
    if not routing.is_file():
        raise SpecError(f"{routing}: routing.json not found (written by `specray export`)")
    router = Router.from_file(routing)
    choices = {}
    for category, tau in temperatures.items():
        route = router.route(tau, 1)
        choices[category] = Choice(str(route.draft_dir) if route.draft_dir else None, route.gamma)
    return choices


def _tokenizer(target: str, draft: str | None):
    from specray.data.chat import require_chat_template
    from specray.models.loading import check_model_dir, check_same_vocabulary, load_tokenizer

    check_model_dir(target)
    tokenizer = load_tokenizer(target)
    require_chat_template(tokenizer, target)
    if draft is not None:
        check_model_dir(draft)
        check_same_vocabulary(tokenizer, load_tokenizer(draft), target, draft)
    return tokenizer


def _run(questions, target_path, tokenizer, temperatures, choices, max_new_tokens, seed, num_choices, out):
    from specray.models.loading import load_model
    from specray.progress import bar
    from specray.serving.bench import (
        BenchSettings,
        format_report,
        identical_at_zero,
        run_bench,
        speed_report,
    )

    settings = BenchSettings(target_path, temperatures, choices, max_new_tokens, seed, num_choices)
    used = sorted({c.draft for c in choices.values() if c.draft})
    typer.echo(f"bench: {len(questions)} questions, target {target_path}, drafts {', '.join(used) or 'none'}")
    for category, tau in temperatures.items():
        choice = choices[category]
        how = f"draft {Path(choice.draft).name}, γ={choice.gamma}" if choice.draft else "target alone"
        typer.echo(f"  {category}: τ={tau:g}, {how}")
    target = load_model(target_path)
    with user_errors(), bar(len(questions), "bench", "question") as meter:
        files = run_bench(questions, tokenizer, target, load_model, settings, out, meter.update)
    typer.echo(f"answers: {files.speculative}\nbaseline: {files.baseline}")
    typer.echo(format_report(speed_report(files.speculative, files.baseline, tokenizer)))
    same, greedy = identical_at_zero(files.speculative, files.baseline)
    if greedy:
        typer.echo(f"τ = 0: {same}/{greedy} speculative answers equal the baseline's")
