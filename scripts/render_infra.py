"""Render the cluster manifests of infra/ with this deployment's settings, which live in one place,
infra/cluster.env (the image and the MLflow server); a variable set in the environment wins over the file.

    python scripts/render_infra.py [--out build/infra]

writes build/infra/kuberay/raycluster.yaml, build/infra/kuberay/rayjob.yaml and
build/infra/ray-cluster-launcher.yaml with every `${NAME}` replaced. A `${NAME}` that neither sets stops it
with the file and the name. Standard library only: it runs before anything is installed.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SETTINGS = REPO / "infra" / "cluster.env"
MANIFESTS = ("kuberay/raycluster.yaml", "kuberay/rayjob.yaml", "ray-cluster-launcher.yaml")
VARIABLE = re.compile(r"\$\{(\w+)\}")


def settings(path: Path = SETTINGS) -> dict[str, str]:
    """NAME=value lines of the settings file, overridden by the environment."""
    found = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            found[name.strip()] = value.strip()
    return {name: os.environ.get(name, value) for name, value in found.items()}


def render(text: str, values: dict[str, str], where: str) -> str:
    def value(match: re.Match[str]) -> str:
        if match.group(1) not in values:
            raise SystemExit(
                f"{where}: ${{{match.group(1)}}} is set neither in {SETTINGS.name} nor in the environment"
            )
        return values[match.group(1)]

    return VARIABLE.sub(value, text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "build" / "infra")
    args = parser.parse_args()
    values = settings()
    for name in MANIFESTS:
        target = args.out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(render((REPO / "infra" / name).read_text(), values, f"infra/{name}"))
        print(f"rendered {target}")


if __name__ == "__main__":
    main()
