"""`make k8s-secrets`, run offline: `kubectl` is a stand-in that keeps what the target
would apply, answers whether the Secret rdurack-postgres exists, and hands everything
else to the real one (which renders the Secrets with `--dry-run=client`). The Secrets it
makes are the ones the pods read, by name and key; the endpoint's token is one the
tokens file the orchestrator reads knows, for a tenant of its own; the tokens file given
is kept as it is; the certificate names the address the endpoint dials; the job store's
URL names the in-cluster server as its manifests make it (or the server given), with a
password beside it, not in it; and a store Secret that exists is kept."""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from cryptography import x509

from rdurack.security.auth import Authenticator, Principal, load_tokens
from tests.support.manifests import ROOT, SECRETS, Obj, env_of, find, render
from tests.support.tokens import TOKENS, write_tokens

# `get secret rdurack-postgres --ignore-not-found -o name` prints the name of a Secret
# that exists and nothing otherwise; FOUND is what the stand-in prints.
KUBECTL_SHIM = """#!/bin/bash
if [ "$1" = apply ]; then
  {{ cat; echo '---'; }} >> {applied}
  exit 0
fi
if [ "$1" = get ]; then
  [ "$*" = "get secret rdurack-postgres --ignore-not-found -o name" ] || exit 9
  printf %s '{found}'
  exit 0
fi
exec {kubectl} "$@"
"""
ENDPOINT_TENANT = "rdurack-endpoint"  # the Makefile's ENDPOINT_TENANT
Secrets = dict[str, dict[str, bytes]]


def make_secrets(tmp: Path, *args: str, found: str = "") -> tuple[Secrets, Path, str]:
    """The Secrets `make k8s-secrets TOKENS=... ARGS` applies (name -> key -> bytes),
    the tokens file it was given, and what it printed."""
    kubectl, make = shutil.which("kubectl"), shutil.which("make")
    if kubectl is None or make is None:
        pytest.skip("make k8s-secrets needs make and kubectl on PATH")
    applied = tmp / "applied.yaml"
    shim = tmp / "kubectl"
    shim.write_text(KUBECTL_SHIM.format(applied=applied, kubectl=kubectl, found=found))
    shim.chmod(0o755)
    tokens = write_tokens(tmp / "tokens.yaml")
    # The set-up stamps are taken as they are: the test runs the target, not an install.
    done = subprocess.run(
        [make, "-C", str(ROOT), "k8s-secrets", f"TOKENS={tokens}", f"K8S_BUILD={tmp}",
         f"KUBECTL={shim}", "-o", ".venv/.installed", "-o", "rdurack/v1/.generated", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    secrets: Secrets = {}
    for doc in yaml.safe_load_all(applied.read_text()):
        if doc is None:
            continue
        assert doc["kind"] == "Secret" and doc["metadata"]["name"] not in secrets
        secrets[doc["metadata"]["name"]] = {k: base64.b64decode(v) for k, v in doc["data"].items()}
    return secrets, tokens, done.stdout


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Secrets, Path]:
    """The Secrets `make k8s-secrets TOKENS=...` applies where none exists yet, and
    the tokens file it was given."""
    secrets, tokens, _ = make_secrets(tmp_path_factory.mktemp("k8s-secrets"))
    return secrets, tokens


def test_it_makes_the_secrets_the_pods_mount(
    made: tuple[Secrets, Path],
) -> None:
    secrets, _ = made
    assert {name: set(keys) for name, keys in secrets.items()} == SECRETS


def test_the_endpoints_token_is_its_own_tenants_in_the_racks_tokens_file(
    made: tuple[Secrets, Path], tmp_path: Path
) -> None:
    secrets, given = made
    tokens_file = tmp_path / "tokens.yaml"
    tokens_file.write_bytes(secrets["rdurack-tokens"]["tokens.yaml"])
    auth = Authenticator(load_tokens(tokens_file))
    token = secrets["rdurack-endpoint-token"]["token"].decode().strip()
    assert len(token) >= 40 and token not in tokens_file.read_text()  # a digest only
    # No quota (its jobs are bounded by its own --sockets) and no admin rights.
    assert auth.authenticate({"authorization": f"Bearer {token}"}) == Principal(ENDPOINT_TENANT)
    # The tenants given keep their tokens and policies; the file given is unchanged.
    for tenant, t in TOKENS.items():
        found = auth.authenticate({"authorization": f"Bearer {t}"})
        assert found is not None and found.tenant == tenant
    merged = load_tokens(tokens_file).tenants
    assert {n: t for n, t in merged.items() if n != ENDPOINT_TENANT} == load_tokens(given).tenants
    assert given.read_text() == write_tokens(tmp_path / "again.yaml").read_text()


def test_the_certificate_names_the_address_the_endpoint_dials(
    made: tuple[Secrets, Path],
) -> None:
    secrets, _ = made
    docs: list[Obj] = render("dev")
    (c,) = find(docs, "Deployment", "rdurack-endpoint")["spec"]["template"]["spec"]["containers"]
    args = list(c["args"])
    host = args[args.index("--address") + 1].rsplit(":", 1)[0]
    cert = x509.load_pem_x509_certificate(secrets["rdurack-tls"]["tls.crt"])
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert host in names.get_values_for_type(x509.DNSName)


def test_the_stores_url_names_the_in_cluster_server_and_the_password_is_beside_it(
    made: tuple[Secrets, Path],
) -> None:
    secrets, _ = made
    store = secrets["rdurack-postgres"]
    url = urlsplit(store["url"].decode())
    docs = render("rack16")  # the overlay with k8s/components/ha-control-plane
    (server,) = find(docs, "StatefulSet", "rdurack-postgres")["spec"]["template"]["spec"][
        "containers"
    ]
    env = env_of(server)
    (port,) = find(docs, "Service", "rdurack-postgres")["spec"]["ports"]
    assert url.scheme == "postgresql" and url.password is None
    assert (url.username, url.hostname, url.port, url.path) == (
        env["POSTGRES_USER"]["value"],
        "rdurack-postgres",
        port["port"],
        "/" + env["POSTGRES_DB"]["value"],
    )
    # A new random password, the whole of the key: a newline would be in PGPASSWORD.
    password = store["password"].decode()
    assert len(password) >= 40 and password.strip() == password and password.isprintable()
    assert password not in store["url"].decode()


def test_a_store_secret_that_exists_is_kept(tmp_path: Path) -> None:
    """PostgreSQL took the first password at its first start: a new one would lock the
    replicas out, so the target leaves the Secret as it is (and makes the others)."""
    secrets, _, said = make_secrets(tmp_path, found="secret/rdurack-postgres")
    assert set(secrets) == set(SECRETS) - {"rdurack-postgres"}
    assert "rdurack-postgres exists: kept" in said


def test_a_server_of_your_own_gets_its_url_and_password(tmp_path: Path) -> None:
    given = tmp_path / "pg-password"
    given.write_text("its password\n")  # as an editor saves it
    url = "postgresql://jobs@db.example.com:6432/rack"
    secrets, _, _ = make_secrets(tmp_path, f"PG_URL={url}", f"PG_PASSWORD_FILE={given}")
    assert secrets["rdurack-postgres"] == {"url": url.encode(), "password": b"its password"}
