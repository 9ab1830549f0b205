"""Teacher pool throughput: tokens/s with 1 and 2 replicas on the tiny zoo target, and their ratio.

    .venv/bin/python -m benchmarks.teacher.pool [--prompts 256] [--max-new-tokens 48] [--repeats 3]
                                                [--threads-reference]
    .venv/bin/python -m benchmarks.teacher.pool --quick   # a smoke check (benchmarks/quick.py)

Every configuration generates the same requests (same prompts, τ, seeds), so every configuration produces
the same tokens — the script checks it — and tokens/s compare like for like. Replicas are CPU-bound Ray
actors with `num_cpus` threads each: the fair comparison is 1 replica x 1 thread against 2 replicas x 1
thread (the target is a ratio >= 1.6 on a 2-core machine). `--threads-reference` adds 1 replica x 2 threads,
what intra-op threading alone gives on the same two cores; on a shared machine it can stall for minutes, as
OpenMP threads wait at a barrier for a sibling the scheduler has parked. Model loading and a warm-up batch
per replica are excluded; the best of `--repeats` timed passes is reported, and each pass prints how many
cores the pool and all other processes kept busy (from /proc; Linux only), since the machine may be shared.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import ray

from benchmarks.quick import MICRO_ZOO
from specray.config import TeacherSpec, ZooSpec
from specray.data.synthetic import synthetic_corpus
from specray.data.templates import format_prompt
from specray.models.zoo import build_zoo
from specray.teacher.generation import GenerationRequest, GenerationResult
from specray.teacher.pool import make_teacher_pool

TEMPERATURES = (0.0, 1.0)
CONFIGS = ((1, 1), (2, 1))  # (replicas, threads per replica)
REFERENCE = (1, 2)  # one replica using both cores through intra-op threads (--threads-reference)


def make_requests(prompts: int, max_new_tokens: int) -> list[GenerationRequest]:
    examples = synthetic_corpus(prompts, seed=99)
    return [
        GenerationRequest(e.id, format_prompt(e.instruction, e.input), tau, 0, max_new_tokens)
        for tau in TEMPERATURES
        for e in examples
    ]


def _jiffies(pids: list[int]) -> tuple[int, int, int]:
    """(all cores busy, all cores total, `pids`' own user+system) CPU ticks so far, from /proc."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    busy = sum(fields) - fields[3] - fields[4]  # minus idle and iowait
    own = 0
    for pid in pids:
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        own += int(stat[11]) + int(stat[12])  # utime, stime
    return busy, sum(fields), own


def timed_pass(pool, requests: list[GenerationRequest], pids: list[int]) -> tuple[float, dict, float, float]:
    """Seconds for one pass, every response by (τ, prompt id), and the cores used by the pool (replicas +
    driver) and by everything else on the machine during the pass."""
    responses: dict = {}

    def collect(results: list[GenerationResult]) -> None:
        responses.update({(r.tau, r.prompt_id): r.response_token_ids for r in results})

    before, started = _jiffies(pids), time.perf_counter()
    pool.generate(requests, collect)
    seconds, after = time.perf_counter() - started, _jiffies(pids)
    busy, total, own = (a - b for a, b in zip(after, before, strict=True))
    cores = os.cpu_count() or 1
    ours = own / os.sysconf("SC_CLK_TCK") / seconds
    return seconds, responses, ours, busy / total * cores - ours


def measure(model_path: str, replicas: int, threads: int, requests, args) -> tuple[float, dict]:
    """Best tokens/s over `args.repeats` passes, and the responses (for the same-output check)."""
    spec = TeacherSpec(
        replicas=replicas, num_cpus=threads, batch_size=args.batch_size, temperatures=list(TEMPERATURES)
    )
    with make_teacher_pool(spec, model_path) as pool:
        pids = [info["pid"] for info in ray.get([a.ready.remote() for a in pool.actors])] + [os.getpid()]
        if not args.quick:  # a smoke check times nothing worth a warm-up
            timed_pass(pool, requests[: args.batch_size * replicas], pids)  # warm-up: one batch per replica
        best, responses = 0.0, {}
        for _ in range(args.repeats):
            seconds, responses, ours, others = timed_pass(pool, requests, pids)
            tokens = sum(len(ids) for ids in responses.values())
            best = max(best, tokens / seconds)
            print(
                f"  {replicas} replica(s) x {threads} thread(s): {tokens} tokens in {seconds:.2f}s "
                f"({tokens / seconds:.0f} tokens/s); cores busy: pool {ours:.2f}, others {others:.2f}"
            )
    return best, responses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--prompts", type=int, default=None, help="per temperature; default 256 (8 with --quick)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 48 (8 with --quick)")
    parser.add_argument("--batch-size", type=int, default=None, help="default 16 (4 with --quick)")
    parser.add_argument("--repeats", type=int, default=None, help="default 3 (1 with --quick)")
    parser.add_argument("--quick", action="store_true", help="a micro zoo and a few prompts: a smoke check")
    parser.add_argument(
        "--threads-reference",
        action="store_true",
        help="also time 1 replica x 2 threads (slow to the point of stalling when another process is busy)",
    )
    args = parser.parse_args()
    quick = args.quick
    args.prompts = args.prompts or (8 if quick else 256)
    args.max_new_tokens = args.max_new_tokens or (8 if quick else 48)
    args.batch_size = args.batch_size or (4 if quick else 16)
    args.repeats = args.repeats or (1 if quick else 3)
    # the default tiny zoo (cached after the first build, ~4 min), or the micro zoo
    zoo = build_zoo(ZooSpec.model_validate(MICRO_ZOO) if quick else ZooSpec())
    requests = make_requests(args.prompts, args.max_new_tokens)
    print(f"tiny target {zoo.target} ({zoo.info['models']['target']['parameters'] / 1e6:.1f}M parameters)")
    print(f"{len(requests)} requests, τ {TEMPERATURES}, batch {args.batch_size}, {os.cpu_count()} cores")
    print(f"load average before: {os.getloadavg()[0]:.2f}")
    ray.init("local", num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1")
    try:
        rates, outputs = {}, []
        for replicas, threads in CONFIGS + ((REFERENCE,) if args.threads_reference else ()):
            rates[replicas, threads], responses = measure(str(zoo.target), replicas, threads, requests, args)
            outputs.append(responses)
    finally:
        ray.shutdown()
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    print("same tokens in every configuration:", all(o == outputs[0] for o in outputs))
    for (replicas, threads), rate in rates.items():
        print(f"{replicas} replica(s) x {threads} torch thread(s): {rate:8.0f} tokens/s")
    ratio = rates[2, 1] / rates[1, 1]
    print(f"2 replicas / 1 replica (1 thread each): {ratio:.2f}x (target >= 1.6x)")
    if ratio < 1.6:
        print(
            "below target: two single-threaded replicas need both cores to themselves; the cores other "
            "processes kept busy during the passes (printed above) were not available to them."
        )


if __name__ == "__main__":
    main()
