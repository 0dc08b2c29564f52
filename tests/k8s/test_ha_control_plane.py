"""k8s/components/ha-control-plane, as the rack16 overlay uses it: two orchestrator
replicas on a PostgreSQL job store, read from its manifests. The replicas read the
store's URL and password from the Secret through variables the orchestrator reads; the
state dir is a claim exactly where the SQLite store lives in it; they run on different
machines and roll one at a time; a disruption budget keeps one; the clients' Service
routes to either; only they reach PostgreSQL, which runs 15 on a volume of its own.
Without the server (a PostgreSQL of your own) the component's replicas/ part renders and
validates alone. With a real server: test_ha_store.py."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest

from rdurack.devtools.postgres import program
from tests.support.manifests import (
    OVERLAYS,
    ROOT,
    SCHEMA_VERSIONS,
    SECRETS,
    Obj,
    admits,
    env_of,
    find,
    labels_of,
    render_dir,
    workloads,
)
from tests.support.orchestrator_pod import orchestrator, settings, variables

HA = "rack16"  # the overlay that lists the component
SECRET = "rdurack-postgres"
# Variables of the orchestrator's container that are not its own settings: Python's,
# the tracing component's, and libpq's password (the store's URL holds none).
# POD_IP is read by Kubernetes only, to expand $(POD_IP) in RDURACK_REPLICA.
FOREIGN_ENV = {"PYTHONUNBUFFERED", "OTEL_EXPORTER_OTLP_ENDPOINT", "PGPASSWORD", "POD_IP"}
PLACEHOLDERS = {
    (SECRET, "url"): "postgresql://rdurack@rdurack-postgres:5432/rdurack",
    (SECRET, "password"): "a-password",
}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_orchestrators_variables_are_settings_it_reads(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    """Every RDURACK_ variable the manifests set is one the orchestrator reads (a typo
    would be ignored silently, and the replica would open STATE_DIR/jobs.sqlite)."""
    _, c = orchestrator(rendered[overlay])
    names = set(env_of(c))
    ours = {n for n in names if n.startswith("RDURACK_")}
    assert ours <= variables(), ours - variables()
    assert names - ours <= FOREIGN_ENV
    assert ("RDURACK_STORE" in names) == ("PGPASSWORD" in names) == (overlay == HA)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_state_dir_is_a_claim_only_where_the_store_lives_in_it(
    rendered: dict[str, list[Obj]], overlay: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orchestrator puts two things under its state dir by default: the SQLite
    store, and training checkpoints. Checkpoints are the node agents' volumes in both
    overlays; so the state dir needs a volume that outlives the pod (one replica, which
    Recreate hands over) exactly where the store is SQLite, and is an emptyDir per
    replica on PostgreSQL (where test_ha_store.py runs it and finds the dir empty)."""
    docs = rendered[overlay]
    deployment, c = orchestrator(docs)
    read = settings(c, PLACEHOLDERS, monkeypatch)
    assert read.checkpoint_dir is not None
    assert not read.checkpoint_dir.is_relative_to(read.state_dir)
    spec = deployment["spec"]["template"]["spec"]
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(read.state_dir)]
    (state,) = [v for v in spec["volumes"] if v["name"] == mount["name"]]
    # The orchestrator's claims; k8s/components/kuberay adds node agents' checkpoint claims.
    claims = [
        d
        for d in docs
        if d["kind"] == "PersistentVolumeClaim"
        and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "node-agent"
    ]
    if read.store:  # PostgreSQL: nothing of the state dir outlives a replica
        assert read.store == PLACEHOLDERS[(SECRET, "url")]
        assert set(state) == {"name", "emptyDir"} and not claims
        assert not [v for v in spec["volumes"] if "persistentVolumeClaim" in v]
        assert deployment["spec"]["replicas"] == 2
    else:  # SQLite: STATE_DIR/jobs.sqlite, on the one claim, one replica at a time
        (claim,) = claims
        assert state["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
        assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
        assert deployment["spec"]["replicas"] == 1
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}


def test_the_replicas_read_the_store_from_the_secret_and_roll_one_at_a_time(
    rendered: dict[str, list[Obj]],
) -> None:
    docs = rendered[HA]
    deployment, c = orchestrator(docs)
    env = env_of(c)
    assert deployment["spec"]["replicas"] == 2
    # Never a literal: the URL may name a server of your own, the password is secret.
    assert env["RDURACK_STORE"] == {
        "name": "RDURACK_STORE",
        "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "url"}},
    }
    assert env["PGPASSWORD"] == {
        "name": "PGPASSWORD",
        "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "password"}},
    }
    # Every Secret's key any container reads is one `make k8s-secrets` makes.
    for w in workloads(docs):
        spec = w["spec"]["template"]["spec"]
        for each in spec.get("initContainers", []) + spec["containers"]:
            for e in each.get("env", []):
                ref = e.get("valueFrom", {}).get("secretKeyRef")
                if ref is not None:
                    assert ref["key"] in SECRETS[ref["name"]] and not ref.get("optional"), e
    # One replica down at a time, and no third pod: the anti-affinity below would leave
    # a surge pod unscheduled on two machines, and the rollout would stall.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }


def test_the_replicas_land_on_different_machines(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered[HA]
    deployment, _ = orchestrator(docs)
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert set(anti) == {"requiredDuringSchedulingIgnoredDuringExecution"}  # not a preference
    (term,) = anti["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert set(term["labelSelector"]) == {"matchLabels"}
    pods = [w["spec"]["template"]["metadata"]["labels"] for w in workloads(docs)]
    selected = [p for p in pods if term["labelSelector"]["matchLabels"].items() <= p.items()]
    assert selected == [labels_of(docs, "orchestrator")]  # its own replicas, nothing else


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_a_disruption_budget_keeps_one_orchestrator(
    rendered: dict[str, list[Obj]], overlay: str
) -> None:
    docs = rendered[overlay]
    deployment, _ = orchestrator(docs)
    replicas = labels_of(docs, "orchestrator")
    budgets = [
        d["spec"]
        for d in docs
        if d["kind"] == "PodDisruptionBudget"
        and d["spec"]["selector"]["matchLabels"].items() <= replicas.items()
    ]
    (budget,) = budgets
    assert budget["minAvailable"] == 1 and "maxUnavailable" not in budget
    if overlay == HA:
        # A drain may take one replica, and a rollout takes no more than the budget
        # lets a drain take: one replica serves throughout.
        spare = deployment["spec"]["replicas"] - budget["minAvailable"]
        assert spare == 1
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] <= spare
        store = find(docs, "PodDisruptionBudget", SECRET)["spec"]
        assert store["minAvailable"] == 1
        assert store["selector"]["matchLabels"].items() <= labels_of(docs, "job-store").items()


def test_the_clients_service_routes_to_any_ready_replica(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered[HA]
    _, c = orchestrator(docs)
    svc = find(docs, "Service", "rdurack-orchestrator")["spec"]
    assert svc["selector"].items() <= labels_of(docs, "orchestrator").items()
    # A virtual IP balanced over the ready endpoints: not headless, not pinned to one
    # client's first replica, never a replica that is not ready.
    for pinned in ("clusterIP", "sessionAffinity", "publishNotReadyAddresses"):
        assert pinned not in svc, pinned
    assert c["readinessProbe"]["grpc"]["port"] == 50052


def test_only_the_orchestrators_reach_postgresql(rendered: dict[str, list[Obj]]) -> None:
    docs = rendered[HA]
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    store, orchestrator = labels_of(docs, "job-store"), labels_of(docs, "orchestrator")
    port = find(docs, "Service", SECRET)["spec"]["ports"][0]["port"]
    assert admits(policies, orchestrator, store, port)
    assert not admits(policies, orchestrator, store, port + 1)
    others = [
        {},  # any pod of the namespace that is not the rack's
        {"app.kubernetes.io/component": "orchestrator"},  # another app's orchestrator
        *(labels_of(docs, n) for n in ("endpoint", "node-agent", "ray-head", "job-store")),
        labels_of(docs, "tracing"),
    ]
    for other in others:
        assert not admits(policies, other, store, port), other
    # The replicas reach each other's API (a follower forwards passes to the leader) by
    # a rule naming them, which holds if the rule open to every client is narrowed.
    named = [
        {**p, "spec": {**p["spec"], "ingress": [r for r in p["spec"]["ingress"] if "from" in r]}}
        for p in policies
    ]
    assert admits(named, orchestrator, orchestrator, 50051)
    assert not admits(named, orchestrator, orchestrator, 50052)


def test_postgresql_15_runs_on_its_own_volume_behind_its_service(
    rendered: dict[str, list[Obj]],
) -> None:
    docs = rendered[HA]
    server = find(docs, "StatefulSet", SECRET)
    (c,) = server["spec"]["template"]["spec"]["containers"]
    image = str(c["image"])
    assert image.split(":")[0] == "postgres"
    # The major the store's tests run against (tests/support/postgres.py).
    done = subprocess.run([program("initdb"), "--version"], capture_output=True, text=True)
    local = done.stdout.split()[-1]  # "initdb (PostgreSQL) 15.18" -> "15.18"
    assert image.split(":")[1].split(".")[0] == local.split(".")[0] == "15"
    (init,) = orchestrator(docs)[0]["spec"]["template"]["spec"]["initContainers"]
    assert init["image"] == image  # pg_isready of the same release, one image to pull
    # Its data on a claim of its own, PGDATA a folder under the mount (not the mount,
    # which may hold lost+found).
    (claim,) = server["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == claim["metadata"]["name"]]
    data = Path(env_of(c)["PGDATA"]["value"])
    assert data.parent == Path(mount["mountPath"])
    assert env_of(c)["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": SECRET,
        "key": "password",
    }
    svc = find(docs, "Service", SECRET)
    assert server["spec"]["serviceName"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None" and not svc["spec"].get("publishNotReadyAddresses")
    (port,) = svc["spec"]["ports"]
    assert {p["name"]: p["containerPort"] for p in c["ports"]} == {port["targetPort"]: 5432}
    # Ready once the server takes TCP connections: the entrypoint's first-start server
    # listens on its unix socket only, which a probe without --host would ask.
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = c[kind]["exec"]["command"]
        assert command[0] == "pg_isready" and "--host=127.0.0.1" in command, kind
        assert f"--port={port['port']}" in command, kind
        user = env_of(c)["POSTGRES_USER"]["value"]
        assert f"--username={user}" in command, kind
    pod = server["spec"]["template"]["spec"]
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["fsGroup"]) == (999, 999)
    # A fast shutdown (SIGTERM alone is a smart one, which waits for the replicas'
    # pooled connections to close), done within the grace period.
    stop = c["lifecycle"]["preStop"]["exec"]["command"]
    assert stop[:2] == ["pg_ctl", "stop"] and "--mode=fast" in stop and "--wait" in stop
    (timeout,) = [int(a.split("=")[1]) for a in stop if a.startswith("--timeout=")]
    assert timeout < pod["terminationGracePeriodSeconds"]


def test_a_server_of_your_own_takes_the_replicas_alone(tmp_path: Path) -> None:
    """ha-control-plane/replicas without the in-cluster server: schema-valid, the
    replicas on the Secret's URL, and nothing of PostgreSQL's (nor its policy)."""
    up = os.path.relpath(ROOT, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources: [{up}/k8s/base]\n"
        f"components: [{up}/k8s/components/ha-control-plane/replicas]\n"
    )
    docs = render_dir(tmp_path)
    for version in SCHEMA_VERSIONS:
        for obj in docs:
            kubernetes_validate.validate(obj, version, strict=True)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert not {n for n in names if n[1] == SECRET}
    assert ("PersistentVolumeClaim", "rdurack-jobs") not in names
    deployment, c = orchestrator(docs)
    assert deployment["spec"]["replicas"] == 2
    assert env_of(c)["RDURACK_STORE"]["valueFrom"]["secretKeyRef"]["name"] == SECRET
