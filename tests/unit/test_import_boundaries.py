"""specray.ops is pure torch: importing it must not pull in ray, mlflow, vllm or transformers."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("ray", "mlflow", "vllm", "transformers")


def test_ops_imports_no_heavy_frameworks() -> None:
    # a fresh interpreter, so modules imported by other tests in this process cannot mask a leak
    script = (
        "import sys, specray.ops\n"
        f"leaked = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(leaked))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "", f"specray.ops imported: {result.stdout.strip()}"
