"""Where a command's CPU goes: the CPU time of every process on the machine while it runs, summed by kind.

    .venv/bin/python scripts/cpu_by_process.py [--every S] [--json FILE] -- COMMAND [ARG ...]

e.g. `.venv/bin/python scripts/cpu_by_process.py -- make test`. A kind is what a process is, not which one:
a Ray actor by its class (`ray::EvalWorker`), a Ray daemon by its program (`raylet`, `dashboard agent`), a
specray CLI by its command (`specray run`), a benchmark by its module, a pytest-xdist worker as `pytest
worker`. Prints, once COMMAND has ended, one line per kind: CPU seconds (user + system), the number of
processes and the CPU per process, the most first; `--json` writes the same table.

Sampled, every `--every` seconds (default 0.5), with psutil: what a process uses after its last sample is
not counted (at most `--every` seconds of it), nor is a process that starts and ends between two samples.
Processes already running when COMMAND starts count only what they use from then on. The machine's other
work counts too: run it on a machine with nothing else running. Exits with COMMAND's exit status.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import psutil

# a Ray daemon's program, by a fragment of its command line -> its kind
RAY_DAEMONS = {
    "raylet/raylet": "raylet",
    "gcs/gcs_server": "gcs_server",
    "dashboard/agent.py": "dashboard agent",
    "dashboard/dashboard.py": "dashboard",
    "_private/log_monitor.py": "log_monitor",
    "autoscaler/_private/monitor.py": "autoscaler monitor",
    "runtime_env/agent": "runtime_env agent",
}


def kind(cmdline: list[str], name: str = "") -> str:
    """What a process is, from its command line (`name`, the kernel's, where it has none)."""
    if not cmdline:
        return f"[{name}]"
    first, line = cmdline[0], " ".join(cmdline)
    if first.startswith("ray::"):  # a Ray worker titles itself ray::CLASS.METHOD while it runs one
        return first.split(".")[0].split(" ")[0]
    for fragment, daemon in RAY_DAEMONS.items():
        if fragment in line:
            return daemon
    if "default_worker.py" in line:  # a Ray worker before it titles itself
        return "ray::IDLE"
    if match := re.search(r"(?:^|/)specray (\S+)", line):
        return f"specray {match.group(1)}"
    if match := re.search(r"-m (benchmarks\.\S+)", line):
        return match.group(1)
    if "exec(eval(sys.stdin.readline()))" in line:  # how pytest-xdist starts its workers
        return "pytest worker"
    if any(Path(arg).name in ("pytest", "py.test") for arg in cmdline[:3]) or "-m pytest" in line:
        return "pytest"
    if ("mlflow" in line and "server" in line) or "uvicorn" in line:
        return "mlflow server"
    return Path(first).name


def telling(before: str | None, now: str) -> str:
    """A process's kind from what it was seen as `before` and is seen as `now`: the latest, unless that
    tells less — an idle Ray worker (its title changes with what it runs) or only the kernel's name (a
    process that has exited and not yet been reaped has no command line)."""
    if before is None:
        return now
    if now.startswith("[") or now == "ray::IDLE":
        return before
    return now


class Sampler:
    """Every process's CPU seconds at its latest sample, and its kind (`telling`)."""

    def __init__(self) -> None:
        self.cpu: dict[tuple[int, float], float] = {}  # (pid, start time) -> CPU seconds
        self.base: dict[tuple[int, float], float] = {}  # the same, for processes alive at the first sample
        self.kinds: dict[tuple[int, float], str] = {}

    def sample(self, first: bool = False) -> None:
        for process in psutil.process_iter(["cmdline", "cpu_times", "create_time", "name"]):
            info = process.info
            if info["cpu_times"] is None or info["create_time"] is None:  # gone, or not ours to read
                continue
            key = (process.pid, info["create_time"])
            seconds = info["cpu_times"].user + info["cpu_times"].system
            self.cpu[key] = max(self.cpu.get(key, 0.0), seconds)
            if first:
                self.base[key] = seconds
            self.kinds[key] = telling(self.kinds.get(key), kind(info["cmdline"] or [], info["name"] or ""))

    def table(self) -> dict[str, tuple[float, int]]:
        """kind -> (CPU seconds since the first sample, processes), the most CPU first; kinds that used
        none left out."""
        seconds: dict[str, float] = defaultdict(float)
        processes: dict[str, int] = defaultdict(int)
        for key, cpu in self.cpu.items():
            used = cpu - self.base.get(key, 0.0)
            if used > 0:
                seconds[self.kinds[key]] += used
                processes[self.kinds[key]] += 1
        ranked = sorted(seconds, key=lambda k: -seconds[k])
        return {k: (round(seconds[k], 2), processes[k]) for k in ranked}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples (default 0.5)")
    parser.add_argument("--json", type=Path, help="also write the table here, as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    if args.every <= 0:
        parser.error(f"--every must be more than 0 seconds, not {args.every}")
    sampler = Sampler()
    sampler.sample(first=True)
    started = time.monotonic()
    process = subprocess.Popen(command)
    while process.poll() is None:
        sampler.sample()
        time.sleep(args.every)
    sampler.sample()
    table = sampler.table()
    total = sum(seconds for seconds, _ in table.values())
    wall = time.monotonic() - started
    print(f"{' '.join(command)}: exit {process.returncode}, wall {wall:.1f} s, CPU {total:.1f} s")
    print(f"{'CPU s':>9} {'procs':>6} {'s/proc':>7}  kind")
    for what, (seconds, count) in table.items():
        print(f"{seconds:9.1f} {count:6d} {seconds / count:7.2f}  {what}")
    if args.json:
        rows = {what: {"cpu_s": seconds, "processes": count} for what, (seconds, count) in table.items()}
        args.json.write_text(json.dumps(rows, indent=1))
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
