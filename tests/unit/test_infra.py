"""Every file under infra/ parses and agrees with the repository: the sweeps and configs it names exist and
validate, the manifests rendered with infra/cluster.env (scripts/render_infra.py) name its image, which
follows the Dockerfile's tag convention, versions match, the image holds every file the shipped sweeps read,
and no secret is committed. A file nobody checks fails `test_every_infra_file_is_checked`."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from specray.config import SourceSpec, load_spec
from specray.sweep.tune.space import check_tune
from tests.conftest import REPO

INFRA = REPO / "infra"
VERSION = re.search(r'^version = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)
SWEEP_PATH = re.compile(r"\bsweeps/[\w./-]+\.yaml\b")
CONFIG_PATH = re.compile(r"\bconfigs/[\w./-]+\.yaml\b")
# Keys whose values are credentials: in a committed file they may only reference the environment or a secret.
SECRET_KEY = re.compile(r"(PASSWORD|SECRET|TOKEN|ACCESS_KEY)", re.IGNORECASE)


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        pending += line.removesuffix("\\").strip() + " "
        if not line.endswith("\\"):
            keyword, _, arguments = pending.strip().partition(" ")
            instructions.append((keyword.upper(), arguments.strip()))
            pending = ""
    assert not pending, f"{path}: dangling line continuation"
    return instructions


def dockerfile_args(path: Path) -> dict[str, str]:
    return dict(a.split("=", 1) for kw, a in dockerfile_instructions(path) if kw == "ARG" and "=" in a)


def load_script(name: str) -> Any:
    """A module of scripts/ (not a package: loaded by path)."""
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RENDER = load_script("render_infra")


def image_tag_convention() -> str:
    """The image infra/cluster.env names, e.g. registry.example.com/specray:0.1.0-cuda12.8.1; the Dockerfile's
    header builds exactly it."""
    header = (INFRA / "docker/Dockerfile").read_text()
    assert 'docker build -f infra/docker/Dockerfile -t "$SPECRAY_IMAGE" .' in header
    return RENDER.settings(INFRA / "cluster.env")["SPECRAY_IMAGE"]


def yaml_documents(path: Path) -> list[Any]:
    """An infra file's YAML documents, rendered with infra/cluster.env as scripts/render_infra.py does."""
    text = RENDER.render(path.read_text(), RENDER.settings(INFRA / "cluster.env"), str(path))
    return [doc for doc in yaml.safe_load_all(text) if doc is not None]


def walk(node: Any, key: str) -> Iterator[Any]:
    """Every value stored under `key`, at any depth."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from walk(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from walk(item, key)


# ---------------------------------------------------------------- per file


def check_image_dockerfile(path: Path) -> None:
    instructions = dockerfile_instructions(path)
    args = dockerfile_args(path)
    base = next(a for kw, a in instructions if kw == "FROM")
    assert base.startswith("nvidia/cuda:${CUDA_VERSION}-") and "runtime" in base
    runs = " ".join(a for kw, a in instructions if kw == "RUN")
    assert 'pip install ".[vllm]" "ray[default]==${RAY_VERSION}"' in runs
    for kw, arguments in instructions:
        if kw == "COPY":  # the build context is the repository root
            for source in shlex.split(arguments)[:-1]:
                assert (REPO / source).exists(), f"COPY {source}: not in the repository"
    assert image_tag_convention().endswith(f"/specray:{VERSION}-cuda{args['CUDA_VERSION']}")


def check_dockerignore(path: Path) -> None:
    patterns = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
    assert {".venv", ".git", "outputs", "mlflow.db", ".specray-cache", "**/.env"} <= set(patterns)
    copied = {"specray", "sweeps", "configs", "pyproject.toml", "README.md"}
    assert not copied & set(patterns), "the image copies these"


def check_kuberay_cluster_spec(cluster: dict, where: str) -> None:
    assert cluster["rayVersion"] == dockerfile_args(INFRA / "docker/Dockerfile")["RAY_VERSION"], where
    assert cluster["enableInTreeAutoscaling"] is True, where
    head = cluster["headGroupSpec"]
    assert head["rayStartParams"]["dashboard-host"] == "0.0.0.0", where  # the Jobs API, inside the cluster
    assert all("nvidia.com/gpu" not in str(c["resources"]) for c in head["template"]["spec"]["containers"])
    gpu_groups = [g for g in cluster["workerGroupSpecs"] if "nvidia.com/gpu" in str(g["template"])]
    assert gpu_groups, f"{where}: no GPU worker group"
    for group in gpu_groups:
        assert 0 <= group["minReplicas"] <= group["replicas"] <= group["maxReplicas"], group["groupName"]
        for container in group["template"]["spec"]["containers"]:
            limits = container["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) >= 1


def check_raycluster(path: Path) -> None:
    docs = {doc["kind"]: doc for doc in yaml_documents(path)}
    assert set(docs) == {"PersistentVolumeClaim", "RayCluster"}
    assert docs["PersistentVolumeClaim"]["spec"]["accessModes"] == ["ReadWriteMany"]  # shared by all nodes
    check_kuberay_cluster_spec(docs["RayCluster"]["spec"], str(path))
    claims = set(walk(docs["RayCluster"], "claimName"))
    assert claims == {docs["PersistentVolumeClaim"]["metadata"]["name"]}


def check_rayjob(path: Path) -> None:
    """A RayJob that runs on its own: it brings its volume claim, the same as the RayCluster's."""
    claim, job = yaml_documents(path)
    cluster_claim = yaml_documents(INFRA / "kuberay/raycluster.yaml")[0]
    assert claim == cluster_claim and claim["kind"] == "PersistentVolumeClaim"
    assert set(walk(job, "claimName")) == {claim["metadata"]["name"]}
    assert job["kind"] == "RayJob" and job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["entrypointNumGpus"] == 0
    check_kuberay_cluster_spec(job["spec"]["rayClusterSpec"], str(path))
    check_entrypoint(job["spec"]["entrypoint"])


def check_entrypoint(entrypoint: str) -> None:
    """The command validates as the job would run it, joins the cluster and writes to the shared volume."""
    command = shlex.split(entrypoint.split("&&")[-1])
    assert command[:2] == ["specray", "run"] and "ray.address=auto" in command
    spec = load_spec(REPO / command[2], command[3:])
    assert spec.ray.address == "auto" and spec.output_dir.startswith("/mnt/shared/")
    assert spec.tracking.uri.startswith("http"), "a job's sqlite file would be lost with its working dir"


def check_cluster_launcher(path: Path) -> None:
    (config,) = yaml_documents(path)
    types = config["available_node_types"]
    assert config["head_node_type"] in types
    assert "GPU" not in str(types[config["head_node_type"]]["resources"])
    workers = {name: t for name, t in types.items() if name != config["head_node_type"]}
    assert any("p4" in t["node_config"]["InstanceType"] for t in workers.values()), "no GPU worker type"
    for name, node_type in workers.items():
        assert 0 <= node_type["min_workers"] <= node_type["max_workers"] <= config["max_workers"], name
    assert "--volume /mnt/shared:/mnt/shared" in config["docker"]["run_options"]


def check_compose(path: Path) -> None:
    (compose,) = yaml_documents(path)
    services = compose["services"]
    assert {"postgres", "minio", "minio-init", "mlflow"} <= set(services)
    mlflow = services["mlflow"]
    assert mlflow["environment"]["MLFLOW_BACKEND_STORE_URI"].startswith("postgresql://")
    assert any(arg.startswith("--artifacts-destination=s3://") for arg in mlflow["command"])
    assert mlflow["environment"]["MLFLOW_S3_ENDPOINT_URL"] == "http://minio:9000"
    server_version = dockerfile_args(path.parent / "Dockerfile")["MLFLOW_VERSION"]
    assert mlflow["image"] == f"specray-mlflow:{server_version}"
    for service in services.values():  # published ports bind to loopback unless the .env says otherwise
        for port in service.get("ports", []):
            assert port.startswith(("127.0.0.1:", "${MLFLOW_BIND:-127.0.0.1}:")), port
    referenced = set(re.findall(r"\$\{(\w+)", path.read_text()))
    assert referenced <= env_example_keys(), "every setting the compose file reads is in .env.example"


def check_mlflow_dockerfile(path: Path) -> None:
    import mlflow

    args = dockerfile_args(path)
    runs = " ".join(a for kw, a in dockerfile_instructions(path) if kw == "RUN")
    assert "mlflow==${MLFLOW_VERSION}" in runs and "psycopg2" in runs and "boto3" in runs
    server, client = (_major_minor(v) for v in (args["MLFLOW_VERSION"], mlflow.__version__))
    assert server[0] == client[0] and server >= client, "the server must be at least the clients' MLflow"


def _major_minor(version: str) -> tuple[int, int]:
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


def env_example_keys() -> set[str]:
    lines = (INFRA / "mlflow/.env.example").read_text().splitlines()
    return {line.split("=", 1)[0] for line in lines if line and not line.startswith("#")}


def check_env_example(path: Path) -> None:
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            if "PASSWORD" in key:
                assert value == "", f"{key}: the example leaves passwords empty"


def check_gitignore(path: Path) -> None:
    assert ".env" in path.read_text().splitlines()


def check_cluster_env(path: Path) -> None:
    """One place for the deployment's settings: every `${NAME}` of every manifest is set there."""
    named = {name for m in RENDER.MANIFESTS for name in RENDER.VARIABLE.findall((INFRA / m).read_text())}
    assert named == set(RENDER.settings(path)) == {"SPECRAY_IMAGE", "SPECRAY_TRACKING_URI"}
    assert not any("registry.example.com" in (INFRA / m).read_text() for m in RENDER.MANIFESTS)


CHECKS: dict[str, Callable[[Path], None]] = {
    "docker/Dockerfile": check_image_dockerfile,
    "docker/Dockerfile.dockerignore": check_dockerignore,
    "kuberay/raycluster.yaml": check_raycluster,
    "kuberay/rayjob.yaml": check_rayjob,
    "ray-cluster-launcher.yaml": check_cluster_launcher,
    "mlflow/docker-compose.yaml": check_compose,
    "mlflow/Dockerfile": check_mlflow_dockerfile,
    "mlflow/.env.example": check_env_example,
    "mlflow/.gitignore": check_gitignore,
    "cluster.env": check_cluster_env,
}
INFRA_FILES = sorted(p for p in INFRA.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def test_every_infra_file_is_checked() -> None:
    found = {p.relative_to(INFRA).as_posix() for p in INFRA_FILES}
    checked = set(CHECKS)
    assert found == checked, f"unchecked: {sorted(found - checked)}; gone: {sorted(checked - found)}"


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_infra_file(name: str) -> None:
    CHECKS[name](INFRA / name)


@pytest.mark.parametrize("path", INFRA_FILES, ids=lambda p: p.relative_to(INFRA).as_posix())
def test_named_sweeps_and_configs_exist_and_validate(path: Path) -> None:
    text = path.read_text()
    for config in CONFIG_PATH.findall(text):
        assert (REPO / config).is_file(), f"{path.name} names {config}, which does not exist"
    for sweep in SWEEP_PATH.findall(text):
        assert (REPO / sweep).is_file(), f"{path.name} names {sweep}, which does not exist"
        load_spec(REPO / sweep)


def test_the_image_follows_the_tag_convention() -> None:
    cuda = dockerfile_args(INFRA / "docker/Dockerfile")["CUDA_VERSION"]
    assert image_tag_convention().endswith(f"/specray:{VERSION}-cuda{cuda}")


@pytest.mark.parametrize("path", [p for p in INFRA_FILES if p.suffix == ".yaml"], ids=lambda p: p.name)
def test_images_carry_the_dockerfiles_tag_or_a_pinned_one(path: Path) -> None:
    tag = image_tag_convention()
    images = [image for doc in yaml_documents(path) for image in walk(doc, "image")]
    for image in images:
        if "specray:" in image and "specray-mlflow" not in image:
            assert image == tag, f"{path.name}: {image} is not the Dockerfile's tag {tag}"
        else:  # third-party images are pinned, so a deployment does not change under us
            assert ":" in image and not image.endswith(":latest"), image


@pytest.mark.parametrize("path", [p for p in INFRA_FILES if p.suffix == ".yaml"], ids=lambda p: p.name)
def test_no_secret_is_committed(path: Path) -> None:
    for doc in yaml_documents(path):
        for mapping in _mappings(doc):
            for key, value in mapping.items():
                if SECRET_KEY.search(str(key)) and isinstance(value, str):
                    assert value.startswith("${"), f"{path.name}: {key} must come from the environment"
                if isinstance(value, str) and "://" in value and "@" in value:  # credentials inside a URI
                    assert re.search(r"://\w+:\$\{\w+", value), f"{path.name}: {key} has a literal password"
    for doc in yaml_documents(path):
        for env in walk(doc, "env"):
            for item in env if isinstance(env, list) else []:
                if SECRET_KEY.search(item["name"]):
                    assert "valueFrom" in item and "value" not in item, f"{path.name}: {item['name']}"


def _mappings(node: Any) -> Iterator[dict]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _mappings(value)
    elif isinstance(node, list):
        for item in node:
            yield from _mappings(item)


def test_paper_scale_sweeps_are_the_papers_grid() -> None:
    grid = load_spec(REPO / "sweeps" / "paper_grid.yaml")
    assert grid.models.target.name_or_path == "meta-llama/Llama-2-13b-chat-hf"
    assert grid.models.draft.name_or_path == "JackFram/llama-68m"
    assert grid.data.train.path == "tatsu-lab/alpaca" and grid.data.out_of_domain.kind == "gsm8k"
    assert grid.teacher.temperatures == [round(0.1 * i, 1) for i in range(11)]
    assert grid.distill.paradigms == ["offline", "online"]
    assert grid.eval.temperatures == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert (grid.eval.repeats, grid.eval.max_new_tokens, grid.teacher.engine) == (5, 128, "vllm")
    out_of_range = load_spec(REPO / "sweeps" / "out_of_range.yaml")
    assert out_of_range.eval.temperatures == [1.5, 2.0]
    # the same shards and drafts as the grid's, so they can be reused
    assert out_of_range.teacher == grid.teacher and out_of_range.distill == grid.distill
    tune = load_spec(REPO / "sweeps" / "composition_tune.yaml")
    assert tune.teacher == grid.teacher and tune.tune.objective_temperatures == [0.8, 1.0]
    check_tune(tune)  # what `specray tune` checks beyond the spec's own validation
    for name in ("paper_grid", "out_of_range", "composition_tune"):
        header = (REPO / "sweeps" / f"{name}.yaml").read_text().split("\nname:")[0]
        assert f"sweeps/{name}.yaml" in header and "GPU-hours by stage" in header, name


# ---------------------------------------------------------------- what the image holds


def image_files() -> tuple[Path, set[Path]]:
    """The image's working folder, and every file the Dockerfile puts there: what it copies from the
    repository and what scripts/fetch_data.sh fetches at build time."""
    instructions = dockerfile_instructions(INFRA / "docker/Dockerfile")
    workdir = Path(next(arguments for kw, arguments in instructions if kw == "WORKDIR"))
    fetched = re.findall(r"^fetch (\S+) https://", (REPO / "scripts/fetch_data.sh").read_text(), re.MULTILINE)
    files: set[Path] = set()
    for kw, arguments in instructions:
        if kw == "COPY":
            *sources, dest = shlex.split(arguments)
            target = Path(os.path.normpath(workdir / dest))
            for source in sources:
                if (REPO / source).is_dir():
                    files |= {
                        target / p.relative_to(REPO / source)
                        for p in (REPO / source).rglob("*")
                        if p.is_file()
                    }
                else:
                    files.add(target / Path(source).name if dest.endswith("/") else target)
        elif kw == "RUN" and "scripts/fetch_data.sh" in arguments:
            folder = shlex.split(arguments.split("scripts/fetch_data.sh", 1)[1])[0]
            files |= {Path(os.path.normpath(workdir / folder / relative)) for relative in fetched}
    return workdir, files


def local_data_files(spec: Any) -> list[str]:
    """The files a spec's data sources read from disk (a hub dataset name reads none)."""
    sources: list[SourceSpec] = [spec.data.train, spec.data.out_of_domain]
    sources += [test_set.source for test_set in spec.data.test_sets.values()]
    hub = [s for s in sources if s.kind == "alpaca" and not s.path.endswith((".json", ".jsonl"))]
    return [s.path for s in sources if s.kind != "synthetic" and s not in hub]


def included_files(path: Path) -> list[Path]:
    """Every YAML file a sweep pulls in with `include:`, at any depth."""
    found = []
    for include in walk(yaml.safe_load(path.read_text()), "include"):
        target = (path.parent / include).resolve()
        found += [target, *included_files(target)]
    return found


@pytest.mark.parametrize("sweep", sorted((REPO / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_the_image_holds_every_file_a_shipped_sweep_reads(sweep: Path) -> None:
    """A job runs `specray run sweeps/NAME.yaml` in the image's working folder (the RayJob's entrypoint
    `cd`s there): the sweep, what it includes and every data file it reads by relative path must be there."""
    workdir, files = image_files()
    (job,) = [d for d in yaml_documents(INFRA / "kuberay/rayjob.yaml") if d["kind"] == "RayJob"]
    assert job["spec"]["entrypoint"].startswith(f"cd {workdir} && specray run sweeps/")
    needed = [sweep, *included_files(sweep)]
    assert [p for p in needed if workdir / p.relative_to(REPO) not in files] == []
    for data_file in local_data_files(load_spec(sweep)):
        assert not Path(data_file).is_absolute(), f"{sweep.name}: {data_file} is not in the image"
        assert Path(os.path.normpath(workdir / data_file)) in files, f"{sweep.name} reads {data_file}"


def test_the_layout_check_finds_a_missing_data_file() -> None:
    workdir, files = image_files()
    assert workdir / "data/gsm8k/test.jsonl" in files and workdir / "sweeps/tiny.yaml" in files
    assert workdir / "data/alpaca/seed_tasks.jsonl" not in files  # a path no sweep may read
