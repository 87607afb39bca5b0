"""Ray cluster-launcher configs (issue 6 item 6): Ray's own validator plus the project's rules.

Each YAML goes through ``prepare_config`` (defaults merged, as ``ray up`` does before any cloud
call) and ``validate_config`` (ray-schema.json and the cross-field checks). No provider is
bootstrapped, so nothing here touches a cloud.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[2]
CLUSTERS = REPO / "clusters"
CONFIGS = ["aws-gpu.yaml", "local-cluster.yaml"]

# GPUs per instance for the GPU types the brief allows (A100, H100, H200).
AWS_GPU_INSTANCES = {
    "p4d.24xlarge": 8,
    "p4de.24xlarge": 8,
    "p5.4xlarge": 1,
    "p5.48xlarge": 8,
    "p5e.48xlarge": 8,
    "p5en.48xlarge": 8,
}
INSTALL_RE = re.compile(r"bash (?P<script>\S+/clusters/node_setup\.sh) install (?P<role>cpu|gpu|auto) (?P<repo>\S+)")
EXPECT_PY_RE = re.compile(r"MEMPRISM_EXPECT_PYTHON=(\S+)")


def load(name: str) -> dict:
    return yaml.safe_load((CLUSTERS / name).read_text())


def prepared(name: str) -> dict:
    return prepare_config(copy.deepcopy(load(name)))


def setup_commands_of(config: dict, node_type: str) -> list[str]:
    """The setup commands Ray runs on a node of this type (after prepare_config's merge)."""
    if node_type == config["head_node_type"]:
        return config["head_setup_commands"]
    return config["available_node_types"][node_type].get("worker_setup_commands", config["worker_setup_commands"])


def installs(commands: list[str]) -> list[re.Match]:
    return [m for c in commands for m in INSTALL_RE.finditer(c)]


@pytest.mark.parametrize("name", CONFIGS)
def test_ray_validator_accepts(name: str) -> None:
    validate_config(prepared(name))


def test_ray_validator_is_live_on_these_configs() -> None:
    # The same path must reject a config broken in ways the schema and cross-checks cover,
    # or the acceptance above proves nothing.
    bad = load("aws-gpu.yaml")
    bad["available_node_types"]["gpu"]["num_gpus"] = 8  # not a node-type field
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(bad))
    bad = load("aws-gpu.yaml")
    bad["available_node_types"]["gpu"]["resources"] = {"vllm": 0.5}  # resources are integers
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(bad))
    bad = load("aws-gpu.yaml")
    bad["max_workers"] = 1  # below the sum of min_workers
    with pytest.raises(ValueError, match="min_workers"):
        validate_config(prepare_config(bad))


def test_aws_node_types_cpu_rollout_and_gpu() -> None:
    config = prepared("aws-gpu.yaml")
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert head["resources"].get("CPU") == 0, "the head must not host rollout actors"
    gpu_types = [n for n, t in types.items() if "vllm" in t["resources"]]
    cpu_types = [n for n in types if n not in gpu_types and n != config["head_node_type"]]
    assert len(gpu_types) == 1 and len(cpu_types) >= 1
    gpu = types[gpu_types[0]]
    instance = gpu["node_config"]["InstanceType"]
    assert instance in AWS_GPU_INSTANCES, f"{instance} is not an A100/H100/H200 instance"
    assert gpu["resources"]["vllm"] == AWS_GPU_INSTANCES[instance], "one `vllm` unit per GPU"
    assert 0 <= gpu["min_workers"] <= gpu["max_workers"]
    for name in cpu_types:
        t = types[name]
        assert not {"GPU", "vllm"} & set(t["resources"]), f"{name} must be a CPU node type"
        assert not t["node_config"]["InstanceType"].startswith(("p", "g")), f"{name} uses a GPU instance"
        assert t["max_workers"] >= 1 and t["min_workers"] <= t["max_workers"]
    # Every type can reach its own maximum at once.
    assert sum(types[n]["max_workers"] for n in [*gpu_types, *cpu_types]) <= config["max_workers"]
    # One AMI everywhere: Ray refuses a node whose Python differs from the head's.
    assert len({t["node_config"]["ImageId"] for t in types.values()}) == 1


def test_aws_setup_installs_from_pyproject_by_role() -> None:
    config = prepared("aws-gpu.yaml")
    types = config["available_node_types"]
    mount_root = next(iter(config["file_mounts"]))
    assert config["file_mounts"][mount_root] == ".", "the repository (ray up's cwd) must be synced"
    roles = {}
    for name in types:
        found = installs(setup_commands_of(config, name))
        assert len(found) == 1, f"{name}: expected exactly one node_setup.sh install, got {len(found)}"
        m = found[0]
        assert m["script"] == f"{mount_root}/clusters/node_setup.sh" and m["repo"] == mount_root
        roles[name] = m["role"]
    gpu = next(n for n, t in types.items() if "vllm" in t["resources"])
    assert roles.pop(gpu) == "gpu"
    assert set(roles.values()) == {"cpu"}
    assert (CLUSTERS / "node_setup.sh").is_file()
    assert any("boto3" in c for c in config["head_setup_commands"]), "the head's autoscaler needs boto3"


@pytest.mark.parametrize("name", CONFIGS)
def test_every_node_checks_the_same_python(name: str) -> None:
    config = prepared(name)
    pythons = set()
    for node_type in config["available_node_types"]:
        for command in setup_commands_of(config, node_type):
            if INSTALL_RE.search(command):
                found = EXPECT_PY_RE.search(command)
                assert found, f"{name}/{node_type}: install without MEMPRISM_EXPECT_PYTHON"
                pythons.add(found.group(1))
    assert len(pythons) == 1


@pytest.mark.parametrize("name", CONFIGS)
def test_start_commands_use_the_venv_and_keep_the_dashboard_local(name: str) -> None:
    config = prepared(name)
    head = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head and "0.0.0.0" not in head
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in config[key] if "ray start" in c]
        assert len(start) == 1, key
        assert 'PATH="$HOME/memprism-venv/bin:$PATH"' in start[0], f"{key}: ray must come from the project venv"
        assert "RAY_AUTH_MODE=" in start[0] and "RAY_USAGE_STATS_ENABLED=0" in start[0]
    assert {".git", ".venv", "runs"} <= set(config["rsync_exclude"])


def test_local_cluster_roles_come_from_the_machine() -> None:
    raw = load("local-cluster.yaml")
    assert raw["provider"]["type"] == "local"
    assert raw["provider"]["head_ip"] and raw["provider"]["worker_ips"]
    config = prepared("local-cluster.yaml")
    (install,) = installs(config["worker_setup_commands"])
    assert install["role"] == "auto", "one node type: each machine must pick cpu/gpu itself"
    assert installs(config["head_setup_commands"])[0]["role"] == "auto"
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = next(c for c in config[key] if "ray start" in c)
        assert "$(bash ~/memprism-ray/clusters/node_setup.sh ray-resources)" in start, key


@pytest.mark.parametrize("name", CONFIGS)
def test_token_auth_is_on_with_the_users_token(name: str) -> None:
    config = prepared(name)
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        (start,) = [c for c in config[key] if "ray start" in c]
        assert "RAY_AUTH_MODE=token" in start and "RAY_AUTH_MODE=disabled" not in start, key
    # The token comes from the user's machine (`ray get-auth-token --generate`), never the repository.
    assert config["file_mounts"].get("~/.ray/auth_token") == "~/.ray/auth_token"
