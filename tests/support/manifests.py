"""The kustomize overlays of k8s/ rendered, and what the manifest tests look up in them."""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = ("dev", "rack16")
# The oldest minor the manifests need (gRPC probes GA 1.27, pod-index label 1.28) that
# kubernetes-validate ships a strict schema for, and the newest it ships.
SCHEMA_VERSIONS = ("1.32.0", "1.37.0")
Obj = dict[str, Any]
# Secrets the pods read, created out of band (Makefile k8s-secrets), and their keys:
# the file names `rdu certs` writes, the tokens file, the endpoint's own token, and the
# job store's URL and password (k8s/components/ha-control-plane).
SECRETS = {
    "rdurack-tls": {"ca.crt", "tls.crt", "tls.key"},
    "rdurack-tokens": {"tokens.yaml"},
    "rdurack-endpoint-token": {"token"},
    "rdurack-postgres": {"url", "password"},
}


def render(overlay: str) -> list[Obj]:
    """Every document of `kubectl kustomize k8s/overlays/<overlay>`."""
    return render_dir(ROOT / "k8s" / "overlays" / overlay)


def render_dir(folder: Path) -> list[Obj]:
    """Every document of `kubectl kustomize FOLDER` (a kustomization's folder)."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not on PATH: cannot render the kustomize overlays")
    out = subprocess.run(
        [kubectl, "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d is not None]
    assert docs, f"{folder} rendered nothing"
    return docs


def find(docs: list[Obj], kind: str, name: str) -> Obj:
    hits = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def workloads(docs: list[Obj]) -> list[Obj]:
    """Deployments, StatefulSets and, as one workload per group, a KubeRay RayCluster's
    head and worker groups (k8s/components/kuberay): {"kind": "RayCluster", "metadata":
    {"name": CLUSTER-GROUP}, "spec": {"template": ...}}, whose pod labels carry the
    ray.io/cluster and ray.io/group labels KubeRay adds to its pods (v1.5.2
    ray-operator/controllers/ray/utils/constant.go), so Service selectors can be checked."""
    out = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    for rc in (d for d in docs if d["kind"] == "RayCluster"):
        name = rc["metadata"]["name"]
        groups = [("headgroup", rc["spec"]["headGroupSpec"])]
        groups += [(g["groupName"], g) for g in rc["spec"].get("workerGroupSpecs", [])]
        for group, g in groups:
            tpl = copy.deepcopy(g["template"])
            tpl["metadata"]["labels"].update({"ray.io/cluster": name, "ray.io/group": group})
            meta = {"name": f"{name}-{group}", "labels": dict(rc["metadata"].get("labels", {}))}
            # KubeRay finds a group's pods by these two labels, as a selector would.
            sel = {"matchLabels": {"ray.io/cluster": name, "ray.io/group": group}}
            spec = {"template": tpl, "selector": sel}
            out.append({"kind": "RayCluster", "metadata": meta, "spec": spec})
    return out


def is_rdurack(container: Obj) -> bool:
    """A container of our own image (not a third-party one such as Jaeger)."""
    return str(container["image"]).split(":")[0] == "rdurack"


def env_of(container: Obj) -> dict[str, Obj]:
    return {e["name"]: e for e in container.get("env", [])}


def component(workload: Obj) -> str:
    """A Deployment's or StatefulSet's pods' `app.kubernetes.io/component`."""
    return str(workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"])


def spec_path(container: Obj) -> str:
    """The rack spec a container reads: RDURACK_SPEC (the rack's processes) or `--spec`
    (`rdu serve`, whose options are a command's)."""
    env = env_of(container)
    if "RDURACK_SPEC" in env:
        return str(env["RDURACK_SPEC"]["value"])
    args = list(container.get("args", []))
    return str(args[args.index("--spec") + 1])


def labels_of(docs: list[Obj], component_name: str) -> dict[str, str]:
    """The pod labels of the workload whose pods are `component_name`."""
    hits = [w for w in workloads(docs) if component(w) == component_name]
    assert hits, f"no workload of component {component_name}"
    # A RayCluster's worker groups share their app labels; ray.io/* tell them apart.
    labels = [
        {
            k: v
            for k, v in w["spec"]["template"]["metadata"]["labels"].items()
            if not k.startswith("ray.io/")
        }
        for w in hits
    ]
    assert all(lab == labels[0] for lab in labels), labels
    return dict(labels[0])


def admits(policies: list[Obj], source: dict[str, str], target: dict[str, str], port: int) -> bool:
    """Whether NetworkPolicies let a pod labelled `source` open a TCP connection to
    `port` of a pod labelled `target`, in one namespace, as the API defines it: a side
    no policy of its direction selects is open; a selected one admits what any of its
    policies' rules admits (a rule without `from`/`to` admits any peer, without `ports`
    any port). Only the forms these manifests use (podSelector matchLabels, numeric
    ports and ranges) are understood; anything else fails the test."""

    def selects(selector: Obj, labels: dict[str, str]) -> bool:
        assert set(selector) <= {"matchLabels"}, f"unsupported selector {selector}"
        return dict(selector.get("matchLabels", {})).items() <= labels.items()

    def peer(rule_peers: list[Obj] | None, labels: dict[str, str]) -> bool:
        if rule_peers is None:
            return True
        for p in rule_peers:
            assert set(p) == {"podSelector"}, f"unsupported peer {p}"
        return any(selects(p["podSelector"], labels) for p in rule_peers)

    def on_port(ports: list[Obj] | None) -> bool:
        if ports is None:
            return True
        for p in ports:
            assert p.get("protocol", "TCP") == "TCP" and isinstance(p["port"], int), p
        return any(p["port"] <= port <= (p.get("endPort") or p["port"]) for p in ports)

    def allowed(direction: str, key: str, own: dict[str, str], other: dict[str, str]) -> bool:
        mine = [
            p["spec"]
            for p in policies
            if direction in p["spec"]["policyTypes"] and selects(p["spec"]["podSelector"], own)
        ]
        if not mine:
            return True
        return any(
            peer(r.get(key), other) and on_port(r.get("ports"))
            for spec in mine
            for r in spec.get(direction.lower(), [])
        )

    return allowed("Ingress", "from", target, source) and allowed("Egress", "to", source, target)
