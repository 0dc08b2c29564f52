"""k8s/components/kuberay as rack16 renders it: Ray as a KubeRay RayCluster with one
worker group per rack node, each reached through its own Service, and the RayCluster
valid against KubeRay's CRD schema (tests/k8s/crds, v1.5.2)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.support.manifests import Obj, env_of, find, render

CRD = Path(__file__).parent / "crds" / "ray.io_rayclusters.yaml"


@pytest.fixture(scope="module")
def docs() -> list[Obj]:
    return render("rack16")


def node_count(docs: list[Obj]) -> int:
    spec = yaml.safe_load(find(docs, "ConfigMap", "rdurack-spec")["data"]["platform.yaml"])
    return int(spec["nodes"])


def ray_cluster(docs: list[Obj]) -> Obj:
    (rc,) = [d for d in docs if d["kind"] == "RayCluster"]
    return rc


def strict(schema: Any) -> Any:
    """The CRD's openAPIV3Schema as a JSON Schema that refuses unknown fields, as the
    API server's strict field validation does, except where the CRD says
    x-kubernetes-preserve-unknown-fields. Other x-kubernetes-* keys (list-type, map-keys,
    int-or-string, CEL validations) and `format` are not checked: jsonschema ignores
    keywords it does not know; int-or-string fields carry their own anyOf."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out.setdefault("additionalProperties", False)
    return out


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft4Validator:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = strict(version["schema"]["openAPIV3Schema"]["properties"]["spec"])
    return jsonschema.Draft4Validator(schema)


def test_raycluster_is_valid_against_the_crd(docs: list[Obj], validator: Any) -> None:
    errors = [e.message for e in validator.iter_errors(ray_cluster(docs)["spec"])]
    assert errors == []


@pytest.mark.parametrize("breakage", ["no_group_name", "wrong_type", "unknown_field"])
def test_the_crd_check_rejects_a_broken_raycluster(
    docs: list[Obj], validator: Any, breakage: str
) -> None:
    spec = copy.deepcopy(ray_cluster(docs)["spec"])
    group = spec["workerGroupSpecs"][0]
    if breakage == "no_group_name":
        del group["groupName"]
    elif breakage == "wrong_type":
        group["replicas"] = "one"
    else:
        group["nodeIndex"] = 0
    assert list(validator.iter_errors(spec)), breakage


def test_one_worker_group_per_rack_node(docs: list[Obj]) -> None:
    groups = ray_cluster(docs)["spec"]["workerGroupSpecs"]
    n = node_count(docs)
    assert [g["groupName"] for g in groups] == [f"node-{i}" for i in range(n)]
    for i, g in enumerate(groups):
        assert (g["replicas"], g["minReplicas"], g["maxReplicas"]) == (1, 1, 1)
        (c,) = g["template"]["spec"]["containers"]
        assert env_of(c)["RDURACK_NODE_INDEX"]["value"] == str(i)
        claims = [
            v["persistentVolumeClaim"]["claimName"]
            for v in g["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v
        ]
        assert claims == [f"rdurack-checkpoints-node-{i}"]
        find(docs, "PersistentVolumeClaim", claims[0])


def test_each_node_has_a_service_and_the_orchestrator_lists_them(docs: list[Obj]) -> None:
    rc = ray_cluster(docs)
    n = node_count(docs)
    for i in range(n):
        svc = find(docs, "Service", f"rdurack-node-{i}")
        # KubeRay's pod labels (v1.5.2 utils/constant.go: ray.io/cluster, ray.io/group).
        assert svc["spec"]["selector"] == {
            "ray.io/cluster": rc["metadata"]["name"],
            "ray.io/group": f"node-{i}",
        }
    (orch,) = find(docs, "Deployment", "rdurack-orchestrator")["spec"]["template"]["spec"][
        "containers"
    ]
    agents = env_of(orch)["RDURACK_AGENTS"]["value"].split(",")
    assert agents == [f"rdurack-node-{i}:50061" for i in range(n)]


def test_the_base_ray_is_gone(docs: list[Obj]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("StatefulSet", "rdurack-node-agent") not in kinds
    assert ("Deployment", "rdurack-ray-head") not in kinds
    assert ("Service", "rdurack-node-agent") not in kinds


def test_worker_pods_run_kuberays_ray_start_then_the_agent(docs: list[Obj]) -> None:
    for g in ray_cluster(docs)["spec"]["workerGroupSpecs"]:
        tpl = g["template"]
        assert tpl["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
        script = " ".join(tpl["spec"]["containers"][0]["command"])
        assert "$KUBERAY_GEN_RAY_START_CMD" in script
        assert "rdurack.processes.node_agent_main" in script
        assert "wait -n" in script  # either process ending ends the pod


def test_rack_nodes_land_on_different_machines(docs: list[Obj]) -> None:
    for g in ray_cluster(docs)["spec"]["workerGroupSpecs"]:
        spec = g["template"]["spec"]
        (term,) = spec["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"
        ]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        own = g["template"]["metadata"]["labels"]
        assert term["labelSelector"]["matchLabels"].items() <= own.items()
