"""The rendered overlays: schema-valid, and their objects agree with one another and with
the project's own rack model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from rdurack.rack.whatif import load_platform
from tests.support import manifests
from tests.support.manifests import (
    OVERLAYS,
    SCHEMA_VERSIONS,
    SECRETS,
    Obj,
    admits,
    component,
    env_of,
    find,
    is_rdurack,
    labels_of,
    workloads,
)

OTEL = "http://jaeger:4317"
NODE_SET = "rdurack-node-agent"  # the base's StatefulSet of node agents
NEEDS_GRPC_PROBES = {"orchestrator", "node-agent"}  # they serve grpc.health.v1
ENDPOINT_PORT = 8000  # `rdu serve`'s: HTTPS, the OpenAI API (test_endpoint.py)
ROOT = Path(__file__).resolve().parents[2]
TLS_ENV = {"RDURACK_TLS_CA": "ca.crt", "RDURACK_TLS_CERT": "tls.crt", "RDURACK_TLS_KEY": "tls.key"}


# What k8s/components/ha-control-plane adds to the rack16 overlay, and what it removes
# (the SQLite store's claim): test_ha_control_plane.py.
HA_ADDS = {
    ("StatefulSet", "rdurack-postgres"),
    ("Service", "rdurack-postgres"),
    ("NetworkPolicy", "rdurack-postgres"),
    ("PodDisruptionBudget", "rdurack-postgres"),
    ("NetworkPolicy", "rdurack-orchestrator-peers"),
}
HA_REMOVES = {("PersistentVolumeClaim", "rdurack-jobs")}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_every_piece(rendered: dict[str, list[Obj]], overlay: str) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in rendered[overlay]}
    if overlay == "rack16":
        assert kinds >= HA_ADDS and not HA_REMOVES & kinds
        kinds = kinds - HA_ADDS | HA_REMOVES
        # k8s/components/kuberay: the RayCluster and its per-node pieces replace Ray's.
        ray_adds = {("RayCluster", "rdurack-ray")} | {
            (k, f"{p}{i}")
            for i in range(2)
            for k, p in (
                ("Service", "rdurack-node-"),
                ("PersistentVolumeClaim", "rdurack-checkpoints-node-"),
            )
        }
        ray_removes = {
            ("Deployment", "rdurack-ray-head"),
            ("Service", "rdurack-ray-head"),
            ("StatefulSet", "rdurack-node-agent"),
            ("Service", "rdurack-node-agent"),
        }
        assert kinds >= ray_adds and not ray_removes & kinds
        kinds = kinds - ray_adds | ray_removes
    assert kinds == {
        ("ConfigMap", "rdurack-spec"),
        ("Deployment", "rdurack-ray-head"),
        ("Service", "rdurack-ray-head"),
        ("StatefulSet", "rdurack-node-agent"),
        ("Service", "rdurack-node-agent"),
        ("Deployment", "rdurack-orchestrator"),
        ("Service", "rdurack-orchestrator"),
        ("PersistentVolumeClaim", "rdurack-jobs"),
        ("NetworkPolicy", "rdurack-orchestrator"),
        ("NetworkPolicy", "rdurack-node-agent"),
        ("NetworkPolicy", "rdurack-ray-head"),
        ("PodDisruptionBudget", "rdurack-node-agent"),
        ("PodDisruptionBudget", "rdurack-orchestrator"),
        ("Deployment", "rdurack-endpoint"),
        ("Service", "rdurack-endpoint"),
        ("NetworkPolicy", "rdurack-endpoint"),
        ("NetworkPolicy", "rdurack-endpoint-to-orchestrator"),
        ("Deployment", "jaeger"),
        ("Service", "jaeger"),
        ("NetworkPolicy", "jaeger"),
    }


@pytest.mark.parametrize("version", SCHEMA_VERSIONS)
@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_strictly_schema_valid(
    rendered: dict[str, list[Obj]], overlay: str, version: str
) -> None:
    for obj in rendered[overlay]:
        if obj["kind"] == "RayCluster":
            continue  # a CRD kubernetes-validate lacks: test_kuberay.py checks its schema
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            pytest.fail(f"{overlay}: {obj['kind']}/{obj['metadata']['name']}: {e.message}")


def test_strict_validation_catches_a_typo() -> None:
    """The check above has teeth: an unknown field fails strict validation."""
    bad: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"selectr": {"a": "b"}, "ports": [{"port": 1}]},
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, SCHEMA_VERSIONS[0], strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_services_select_pods_and_name_their_ports(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    docs = rendered[overlay]
    pods = [w["spec"]["template"] for w in workloads(docs)]
    for svc in (d for d in docs if d["kind"] == "Service"):
        selector = svc["spec"]["selector"]
        matched = [p for p in pods if selector.items() <= p["metadata"]["labels"].items()]
        assert len(matched) == 1, f"Service {svc['metadata']['name']} selects {len(matched)}"
        ports = {
            p["name"]: p["containerPort"]
            for c in matched[0]["spec"]["containers"]
            for p in c["ports"]
        }
        for port in svc["spec"]["ports"]:
            assert port["targetPort"] in ports, f"{svc['metadata']['name']}: {port}"
            assert ports[port["targetPort"]] == port["port"]
    for w in workloads(docs):
        labels = w["spec"]["template"]["metadata"]["labels"]
        assert w["spec"]["selector"]["matchLabels"].items() <= labels.items()
    for pdb in (d for d in docs if d["kind"] in ("PodDisruptionBudget", "NetworkPolicy")):
        sel = pdb["spec"].get("selector") or pdb["spec"]["podSelector"]
        assert any(sel["matchLabels"].items() <= p["metadata"]["labels"].items() for p in pods)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_probes_use_declared_ports(rendered: dict[str, list[Obj]], overlay: str) -> None:
    for w in workloads(rendered[overlay]):
        for c in w["spec"]["template"]["spec"]["containers"]:
            names = {p["name"] for p in c["ports"]}
            numbers = {p["containerPort"] for p in c["ports"]}
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                probe = c.get(kind)
                if probe is None:
                    continue
                if "exec" in probe:  # pg_isready (PostgreSQL): its --port, a number
                    (port,) = [
                        int(a.split("=", 1)[1])
                        for a in probe["exec"]["command"]
                        if a.startswith("--port=")
                    ]
                    assert port in numbers, f"{c['name']} {kind}"
                    continue
                action = probe.get("grpc") or probe.get("tcpSocket") or probe.get("httpGet")
                assert action is not None, f"{c['name']} {kind}"
                port = action["port"]
                assert port in (names if isinstance(port, str) else numbers), f"{c['name']} {kind}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_hardened_and_bounded(rendered: dict[str, list[Obj]], overlay: str) -> None:
    for w in workloads(rendered[overlay]):
        spec = w["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec.get("initContainers", []):  # they run to an end: no probes
            where = f"{overlay}: {w['metadata']['name']}/{c['name']} (init)"
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True and sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= c["resources"][bound].keys(), where
        for c in spec["containers"]:
            where = f"{overlay}: {w['metadata']['name']}/{c['name']}"
            sc = c["securityContext"]
            assert sc["runAsNonRoot"] is True, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["capabilities"]["drop"] == ["ALL"], where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= c["resources"][bound].keys(), where
            assert c["readinessProbe"] and c["livenessProbe"], where
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert "emptyDir" in volumes[mounts["/tmp"]], where  # writable despite read-only /
            if not is_rdurack(c):
                continue
            assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", where
            if component(w) in NEEDS_GRPC_PROBES:
                port = env_of(c)
                # The probes ask the plaintext health port (they present no client
                # certificate, and the API port is TLS), never the API port itself.
                for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                    assert "grpc" in c[kind], f"{where} {kind}"
                named = {p["name"]: p["containerPort"] for p in c["ports"]}
                probed = {
                    c[k]["grpc"]["port"]
                    for k in ("startupProbe", "readinessProbe", "livenessProbe")
                }
                assert probed == {named["health"]} != {named["grpc"]}, where
                assert int(port["RDURACK_HEALTH_PORT"]["value"]) == named["health"], where
                key = (
                    "RDURACK_AGENT_PORT"
                    if component(w) == "node-agent"
                    else "RDURACK_ORCHESTRATOR_PORT"
                )
                assert int(port[key]["value"]) == named["grpc"], where
            elif component(w) != "endpoint":  # its HTTPS probes: test_endpoint.py
                assert c["livenessProbe"]["tcpSocket"]["port"] == "gcs", where


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_rack_shape_agrees_everywhere(
    rendered: dict[str, list[Obj]], overlay: str, tmp_path: Path
) -> None:
    """The spec's nodes = the node agents' pods (StatefulSet replicas, or RayCluster
    worker groups) = the orchestrator's agent list, and the spec is valid for the
    project's own model."""
    docs = rendered[overlay]
    spec_file = tmp_path / "platform.yaml"
    spec_file.write_text(find(docs, "ConfigMap", "rdurack-spec")["data"]["platform.yaml"])
    platform = load_platform("sn40l-rack16", spec_file)

    orchestrator = find(docs, "Deployment", "rdurack-orchestrator")
    (orch,) = orchestrator["spec"]["template"]["spec"]["containers"]
    agents = env_of(orch)["RDURACK_AGENTS"]["value"].split(",")
    pods = node_agent_pods(docs)
    port = env_of(pods[0]["containers"][0])["RDURACK_AGENT_PORT"]["value"]
    assert platform.nodes == len(pods) == len(agents)
    sets = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == NODE_SET]
    if sets:  # the base: one StatefulSet, a pod per node, named by ordinal
        assert sets[0]["spec"]["replicas"] == platform.nodes
        service = sets[0]["spec"]["serviceName"]
        assert agents == [f"{NODE_SET}-{i}.{service}:{port}" for i in range(platform.nodes)]
    else:  # k8s/components/kuberay: a worker group and a Service per node
        assert agents == [f"rdurack-node-{i}:{port}" for i in range(platform.nodes)]
    assert (platform.nodes, platform.node.sockets) == {"dev": (1, 2), "rack16": (2, 8)}[overlay]
    # Every rdurack process reads the same mounted spec.
    for w in workloads(docs):
        for c in w["spec"]["template"]["spec"]["containers"]:
            if is_rdurack(c) and component(w) != "ray-head":
                path = Path(manifests.spec_path(c))
                mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent))
                volume = next(
                    v
                    for v in w["spec"]["template"]["spec"]["volumes"]
                    if v["name"] == mount["name"]
                )
                assert volume["configMap"]["name"] == "rdurack-spec"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pods_get_identity_from_the_downward_api(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    for i, pod in enumerate(node_agent_pods(rendered[overlay])):
        (agent,) = pod["containers"]
        env = env_of(agent)
        if overlay == "dev":  # the StatefulSet's pod ordinal is the node index
            assert env["RDURACK_NODE_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == (
                "metadata.labels['apps.kubernetes.io/pod-index']"
            )
            assert env["RAY_ADDRESS"]["value"] == "rdurack-ray-head:6379"
        else:  # one worker group per node, its index written in; KubeRay's head Service
            assert env["RDURACK_NODE_INDEX"]["value"] == str(i)
            assert env["RAY_ADDRESS"]["value"] == "rdurack-ray-head-svc:6379"
        assert env["RDURACK_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        # 0 would pin Ray to loopback and refuse worker nodes (see ray-head.yaml).
        assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"]["value"] == "1"
        mounts = {m["mountPath"] for m in agent["volumeMounts"]}
        assert "/var/lib/rdurack/checkpoints" in mounts


def node_agent_pods(docs: list[Obj]) -> list[Obj]:
    """The pod specs of the node agents, in node order: the base StatefulSet's one
    template per node (dev), or each RayCluster worker group's (rack16)."""
    sets = [d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"] == NODE_SET]
    if sets:
        return [sets[0]["spec"]["template"]["spec"]] * int(sets[0]["spec"]["replicas"])
    (cluster,) = [d for d in docs if d["kind"] == "RayCluster"]
    return [g["template"]["spec"] for g in cluster["spec"]["workerGroupSpecs"]]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tracing_reaches_every_rdurack_container(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    docs = rendered[overlay]
    ours = [c for w in workloads(docs) for c in w["spec"]["template"]["spec"]["containers"]]
    ours = [c for c in ours if is_rdurack(c)]
    # Orchestrator, endpoint, Ray head and the node agents: one StatefulSet (dev), or
    # one RayCluster worker group per rack node (rack16, k8s/components/kuberay).
    groups = [w for w in workloads(docs) if w["kind"] == "RayCluster"]
    assert len(ours) == (4 if not groups else 2 + len(groups))
    for c in ours:
        assert env_of(c)["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == OTEL, c["name"]
    jaeger = find(docs, "Service", "jaeger")
    assert {p["port"] for p in jaeger["spec"]["ports"]} == {16686, 4317}
    (jc,) = find(docs, "Deployment", "jaeger")["spec"]["template"]["spec"]["containers"]
    assert env_of(jc)["COLLECTOR_OTLP_ENABLED"]["value"] == "true"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_orchestrator_listens_on_every_pod_address_and_names_its_pod_ip(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """0.0.0.0: a Service and the probes reach the pod IP, `kubectl port-forward` the
    pod's loopback (a server on the pod IP alone would refuse the latter). Its replica
    name, the address other replicas forward to, is the pod IP, defined before it."""
    (orch,) = find(rendered[overlay], "Deployment", "rdurack-orchestrator")["spec"]["template"][
        "spec"
    ]["containers"]
    env = env_of(orch)
    assert env["RDURACK_HOST"]["value"] == "0.0.0.0"
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["RDURACK_REPLICA"]["value"] == "$(POD_IP):$(RDURACK_ORCHESTRATOR_PORT)"
    order = [e["name"] for e in orch["env"]]
    assert order.index("RDURACK_REPLICA") > max(
        order.index("POD_IP"), order.index("RDURACK_ORCHESTRATOR_PORT")
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_network_policy_exposes_the_orchestrator_and_the_endpoint_only(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    docs = rendered[overlay]
    policies = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "NetworkPolicy"}
    # A pod no policy selects admits everything: every pod here is selected by one.
    for w in workloads(docs):
        labels = w["spec"]["template"]["metadata"]["labels"]
        selected = [p for p in policies.values() if p["podSelector"]["matchLabels"].items()
                    <= labels.items()]  # fmt: skip
        assert selected, f"{overlay}: no NetworkPolicy selects {w['metadata']['name']}"
    open_rules = {
        name: [r for r in spec["ingress"] if "from" not in r] for name, spec in policies.items()
    }
    # Rules without `from` admit any client: the orchestrator's API port, the endpoint's
    # port (and Jaeger's UI), nothing else.
    assert {name: rules for name, rules in open_rules.items() if rules} == {
        "rdurack-orchestrator": [{"ports": [{"protocol": "TCP", "port": 50051}]}],
        "rdurack-endpoint": [{"ports": [{"protocol": "TCP", "port": ENDPOINT_PORT}]}],
        "jaeger": [{"ports": [{"protocol": "TCP", "port": 16686}]}],
    }
    assert all("from" not in r for r in policies["rdurack-endpoint"]["ingress"])
    agent_rules = policies["rdurack-node-agent"]["ingress"]
    sources = [
        {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in r["from"]}
        for r in agent_rules
    ]
    assert sources == [{"orchestrator"}, {"node-agent", "ray-head"}]
    assert agent_rules[0]["ports"] == [{"protocol": "TCP", "port": 50061}]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_tls_and_tokens_come_from_the_secrets(rendered: dict[str, list[Obj]], overlay: str) -> None:
    """Every rdurack process but the Ray head reads its certificate files from the
    mounted Secret rdurack-tls, by the key names `rdu certs` writes; the orchestrator
    and the endpoint read the tokens file from rdurack-tokens, and the endpoint its own
    token for the orchestrator from rdurack-endpoint-token, which no other pod mounts.
    No Secret is in the manifests (none is committed): each is mounted required, so a
    pod without it does not start open."""
    docs = rendered[overlay]
    assert not [d for d in docs if d["kind"] == "Secret"]
    checked = set()
    mounted = set()
    for w in workloads(docs):
        spec = w["spec"]["template"]["spec"]
        mounted |= {
            (component(w), v["secret"]["secretName"]) for v in spec["volumes"] if "secret" in v
        }
        if component(w) == "ray-head":
            continue
        volumes = {v["name"]: v for v in spec["volumes"]}
        for c in spec["containers"]:
            if not is_rdurack(c):
                continue
            env = env_of(c)
            wanted = dict(TLS_ENV)
            if component(w) in ("orchestrator", "endpoint"):
                wanted["RDURACK_TOKENS"] = "tokens.yaml"
            if component(w) == "endpoint":  # a client of the orchestrator: `rdu --token-file`
                wanted["RDURACK_TOKEN_FILE"] = "token"
            for var, key in wanted.items():
                path = Path(env[var]["value"])
                assert path.name == key, (component(w), var)
                mount = next(m for m in c["volumeMounts"] if m["mountPath"] == str(path.parent))
                assert mount.get("readOnly") is True
                secret = volumes[mount["name"]]["secret"]
                assert key in SECRETS[secret["secretName"]] and not secret.get("optional")
                assert secret["defaultMode"] & 0o007 == 0, "world-readable key"
                checked.add((component(w), secret["secretName"]))
    assert checked == {
        ("orchestrator", "rdurack-tls"),
        ("orchestrator", "rdurack-tokens"),
        ("node-agent", "rdurack-tls"),
        ("endpoint", "rdurack-tls"),
        ("endpoint", "rdurack-tokens"),
        ("endpoint", "rdurack-endpoint-token"),
    }
    assert mounted == checked  # nothing mounted that is not read (a token in the clear)
    makefile = (ROOT / "Makefile").read_text()
    for name in SECRETS:  # the documented way to create them names them alike
        assert f"create secret generic {name}" in makefile


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_endpoint_reaches_the_orchestrators_api_and_no_other_rack_port(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """Its endpoint jobs and passes go to the orchestrator's 50051: admitted by the
    policies, and still admitted by a rule naming the endpoint alone, were the base's
    rule open to every client narrowed. The orchestrator's health port, the node agents
    and the Ray head stay closed to it."""
    docs = rendered[overlay]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    endpoint, orchestrator = labels_of(docs, "endpoint"), labels_of(docs, "orchestrator")
    agent, head = labels_of(docs, "node-agent"), labels_of(docs, "ray-head")
    assert admits(policies, endpoint, orchestrator, 50051)
    named = [
        {**p, "spec": {**p["spec"], "ingress": [r for r in p["spec"]["ingress"] if "from" in r]}}
        for p in policies
    ]
    assert admits(named, endpoint, orchestrator, 50051)
    for target, port in ((orchestrator, 50052), (agent, 50061), (agent, 50062), (head, 6379)):
        assert not admits(policies, endpoint, target, port), (target, port)
    # The check itself tells rack members from outsiders.
    assert admits(policies, orchestrator, agent, 50061)
    assert admits(policies, {}, orchestrator, 50051) and not admits(named, {}, orchestrator, 50051)
    assert not admits(policies, {}, agent, 50061)
