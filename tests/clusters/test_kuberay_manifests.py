"""KubeRay RayCluster and RayJob manifests (issue 6 item 6): the fields KubeRay needs, and
(issue 10 item 5) token auth on with the dashboard fenced by a NetworkPolicy.

No Kubernetes API server here, so the checks follow the ray.io/v1 CRD by hand: required
fields, string-valued rayStartParams (map[string]string), replica bounds, GPU limits on the
GPU group only, the `vllm` marker as `ray start --resources` will receive it, and images and
users that match the Dockerfiles.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import tomllib
import yaml

REPO = Path(__file__).resolve().parents[2]
KUBERAY = REPO / "clusters" / "kuberay"
ENTRYPOINT = ["python", "jobs/grpo_alfworld.py", "--config", "configs/alfworld_paper.yaml"]


def load(name: str) -> dict:
    docs = list(yaml.safe_load_all((KUBERAY / name).read_text()))
    assert len(docs) == 1, f"{name}: expected one manifest"
    return docs[0]


def cluster_specs() -> list[tuple[str, dict]]:
    return [
        ("raycluster.yaml", load("raycluster.yaml")["spec"]),
        ("rayjob.yaml", load("rayjob.yaml")["spec"]["rayClusterSpec"]),
    ]


def pyproject_pin(name: str) -> str:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    (dep,) = [d for d in deps if re.match(rf"{re.escape(name)}(\[|==)", d)]
    return dep.split("==", 1)[1]


def ray_resources(params: dict) -> dict:
    """The custom resources `ray start` gets: KubeRay splices the value into a shell command."""
    if "resources" not in params:
        return {}
    (arg,) = shlex.split(f"--resources={params['resources']}")
    return json.loads(arg.removeprefix("--resources="))


def gpu_limit(container: dict) -> int:
    return int(container.get("resources", {}).get("limits", {}).get("nvidia.com/gpu", 0))


def test_kinds_and_names() -> None:
    cluster, job = load("raycluster.yaml"), load("rayjob.yaml")
    assert (cluster["apiVersion"], cluster["kind"]) == ("ray.io/v1", "RayCluster")
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    for doc in (cluster, job):
        assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"]), "not a DNS-1123 name"


@pytest.mark.parametrize("which", [0, 1], ids=["raycluster", "rayjob"])
def test_cluster_spec_fields(which: int) -> None:
    name, spec = cluster_specs()[which]
    assert spec["rayVersion"] == pyproject_pin("ray"), f"{name}: rayVersion must match pyproject's Ray pin"
    head = spec["headGroupSpec"]
    groups = [("head", head), *[(g["groupName"], g) for g in spec["workerGroupSpecs"]]]
    assert len({g for g, _ in groups}) == len(groups), "group names must be unique"
    for group, body in groups:
        params = body["rayStartParams"]
        assert isinstance(params, dict)
        bad = {k: v for k, v in params.items() if not isinstance(v, str)}
        assert not bad, f"{name}/{group}: rayStartParams values must be strings, got {bad}"
        containers = body["template"]["spec"]["containers"]
        assert containers[0]["image"], f"{name}/{group}: no image"
        limits = containers[0]["resources"]["limits"]
        assert "cpu" in limits and "memory" in limits, f"{name}/{group}: Ray sizes itself from the limits"
    for g in spec["workerGroupSpecs"]:
        assert all(isinstance(g[k], int) for k in ("replicas", "minReplicas", "maxReplicas"))
        assert 0 <= g["minReplicas"] <= g["replicas"] <= g["maxReplicas"], g["groupName"]
    assert head["rayStartParams"].get("num-cpus") == "0", "actors belong on workers"
    assert head.get("serviceType", "ClusterIP") == "ClusterIP", "the dashboard must not be exposed outside"
    ports = {p["name"]: p["containerPort"] for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports.get("dashboard") == 8265


@pytest.mark.parametrize("which", [0, 1], ids=["raycluster", "rayjob"])
def test_gpu_group_has_gpus_and_the_vllm_marker(which: int) -> None:
    name, spec = cluster_specs()[which]
    assert gpu_limit(spec["headGroupSpec"]["template"]["spec"]["containers"][0]) == 0
    gpu_groups = []
    for g in spec["workerGroupSpecs"]:
        container = g["template"]["spec"]["containers"][0]
        n = gpu_limit(container)
        marker = ray_resources(g["rayStartParams"]).get("vllm", 0)
        if n:
            gpu_groups.append(g["groupName"])
            assert marker == n, f"{name}/{g['groupName']}: vllm marker {marker} != {n} GPUs"
            assert container["image"].endswith("-gpu"), "GPU groups run the vLLM image"
            assert any(t.get("key") == "nvidia.com/gpu" for t in g["template"]["spec"].get("tolerations", []))
        else:
            assert marker == 0, f"{name}/{g['groupName']}: a CPU group must not advertise vllm"
            assert container["image"].endswith("-cpu")
    assert len(gpu_groups) == 1 and len(spec["workerGroupSpecs"]) >= 2, "need a CPU rollout group and a GPU group"


def test_marker_parsing_matches_kuberay_quoting() -> None:
    # The helper must read KubeRay's '"{\"x\": 1}"' form and reject a malformed one.
    assert ray_resources({"resources": '"{\\"vllm\\": 2}"'}) == {"vllm": 2}
    with pytest.raises(json.JSONDecodeError):
        ray_resources({"resources": "{vllm:2}"})
    with pytest.raises(ValueError):  # unquoted JSON with a space: two shell words
        ray_resources({"resources": '{"vllm": 2}'})


@pytest.mark.parametrize("which", [0, 1], ids=["raycluster", "rayjob"])
def test_pods_run_as_the_images_user(which: int) -> None:
    _, spec = cluster_specs()[which]
    dockerfile = (REPO / "docker" / "Dockerfile.cpu").read_text()
    uid = int(re.search(r"^ARG APP_UID=(\d+)$", dockerfile, re.M).group(1))
    for body in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        security = body["template"]["spec"]["securityContext"]
        assert security["runAsNonRoot"] is True and security["runAsUser"] == uid


def test_rayjob_runs_the_grpo_job_and_cleans_up() -> None:
    job = load("rayjob.yaml")["spec"]
    assert shlex.split(job["entrypoint"]) == ENTRYPOINT
    assert job["shutdownAfterJobFinishes"] is True
    assert isinstance(job.get("ttlSecondsAfterFinished"), int)
    assert job["rayClusterSpec"] == load("raycluster.yaml")["spec"], "rayjob.yaml drifted from raycluster.yaml"


@pytest.mark.parametrize("path", [ENTRYPOINT[1], ENTRYPOINT[3]])
def test_rayjob_entrypoint_files_exist(path: str) -> None:
    assert (REPO / path).is_file(), f"the RayJob entrypoint names {path}, which is not in the repository"


@pytest.mark.parametrize("which", [0, 1], ids=["raycluster", "rayjob"])
def test_token_auth_is_on_and_never_switched_off(which: int) -> None:
    name, spec = cluster_specs()[which]
    assert spec.get("authOptions", {}).get("mode") == "token", f"{name}: Ray token auth must be on"
    for body in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]:
        for container in body["template"]["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container.get("env", [])}
            # KubeRay sets RAY_AUTH_MODE/RAY_AUTH_TOKEN from authOptions; a value here would fight it.
            assert "RAY_AUTH_MODE" not in env and "RAY_AUTH_TOKEN" not in env, f"{name}: {env}"


def test_dashboard_on_all_pod_interfaces_only_behind_auth_and_a_network_policy() -> None:
    policy = load("networkpolicy.yaml")
    assert (policy["apiVersion"], policy["kind"]) == ("networking.k8s.io/v1", "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    for _, cluster in cluster_specs():
        head = cluster["headGroupSpec"]
        labels = head["template"]["metadata"]["labels"]
        selected = spec["podSelector"]["matchLabels"]
        assert selected.items() <= labels.items(), "the policy must select the head pod"
        for g in cluster["workerGroupSpecs"]:
            assert selected.items() <= g["template"]["metadata"]["labels"].items()
        if head["rayStartParams"].get("dashboard-host", "127.0.0.1") != "127.0.0.1":
            assert cluster["authOptions"]["mode"] == "token"
    peers, others = [], []
    for rule in spec["ingress"]:
        (peers if "ports" not in rule else others).append(rule)
    # Unrestricted ports only between the cluster's own pods.
    for rule in peers:
        assert rule["from"] == [{"podSelector": {"matchLabels": spec["podSelector"]["matchLabels"]}}]
    # Everyone else: the dashboard port only, and never "from anywhere".
    for rule in others:
        assert rule["ports"] == [{"protocol": "TCP", "port": 8265}]
        assert rule["from"] and all(peer.get("podSelector", {}).get("matchLabels") for peer in rule["from"])
    job = load("rayjob.yaml")
    submitters = [p["podSelector"]["matchLabels"] for r in others for p in r["from"] if "namespaceSelector" not in p]
    assert {"ray.io/originated-from-crd": "RayJob", "ray.io/originated-from-cr-name": job["metadata"]["name"]} in (
        submitters
    )
