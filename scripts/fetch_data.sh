#!/usr/bin/env bash
# Fetch the data files the shipped sweeps read by relative path, into DEST (default: data/, where those
# paths point when specray runs from the repository root). The image (infra/docker/Dockerfile) runs it at
# build time, so a cluster job finds them under /opt/specray/data; `specray submit` uploads a local data/
# with the working directory. Files already present are kept.
#   scripts/fetch_data.sh [DEST]
# What it fetches, from where, and under which licence:
#   gsm8k/test.jsonl           GSM8K's test set, 1,319 grade-school math problems (out-of-domain test set of
#                              sweeps/paper_grid.yaml and the paper-scale sweeps that include it).
#   gsm8k/train.jsonl          GSM8K's 7,473 training problems (sweeps/smollm2.yaml: its KD prompts and its
#                              in-domain test set). Both https://github.com/openai/grade-school-math — MIT licence.
#   self_instruct/seed_tasks.jsonl  the 175 seed tasks of Self-Instruct (sweeps/smollm2.yaml's out-of-domain
#                              test set). https://github.com/yizhongw/self-instruct — Apache-2.0.
#   spec_bench/question.jsonl  Spec-Bench's 480 questions in 13 categories, MT-bench's 80 among them
#                              (sweeps/mt_bench_tiny.yaml, `specray bench`). https://github.com/hemingkx/Spec-Bench
#                              — Apache-2.0; its questions come from MT-bench, WMT14, CNN/Daily Mail, Natural
#                              Questions, GSM8K and DPR, each also under its own terms.
set -euo pipefail
dest=${1:-data}

fetch() {  # fetch RELATIVE_PATH URL: into $dest, through a temporary name so a cut download leaves nothing
  local path="$dest/$1"
  if [ -s "$path" ]; then
    echo "fetch_data: $path already there"
    return
  fi
  mkdir -p "$(dirname "$path")"
  curl -fsSL --retry 3 -o "$path.part" "$2"
  mv "$path.part" "$path"
  echo "fetch_data: $path <- $2"
}

fetch gsm8k/test.jsonl https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/test.jsonl
fetch gsm8k/train.jsonl https://raw.githubusercontent.com/openai/grade-school-math/master/grade_school_math/data/train.jsonl
fetch self_instruct/seed_tasks.jsonl https://raw.githubusercontent.com/yizhongw/self-instruct/main/data/seed_tasks.jsonl
fetch spec_bench/question.jsonl https://raw.githubusercontent.com/hemingkx/Spec-Bench/main/data/spec_bench/question.jsonl
