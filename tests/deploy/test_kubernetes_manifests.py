"""deploy/kubernetes/ against the Kubernetes schemas (kubernetes-validate, strict) and against
itself; and proof that the check catches a broken manifest."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from k8s_manifests import (
    RenderError,
    load,
    reference_errors,
    referenced_files,
    render,
    schema_errors,
    setting_errors,
)

ROOT = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
KUSTOMIZATIONS = (ROOT, ROOT / "base", ROOT / "postgres")
EXTRAS = ROOT / "extras"


def everything(root: Path = ROOT) -> list[dict]:
    """The default kustomization and the extras (Secrets template, admin pod) together."""
    manifests = render(root)
    for path in sorted((root / "extras").glob("*.yaml")):
        manifests.extend(load(path))
    return manifests


@pytest.mark.parametrize("directory", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_kustomization_passes_the_schemas(directory: Path) -> None:
    manifests = render(directory)
    assert manifests
    assert schema_errors(manifests) == []


def test_the_extras_pass_the_schemas() -> None:
    manifests = [m for path in sorted(EXTRAS.glob("*.yaml")) for m in load(path)]
    assert {m["kind"] for m in manifests} == {"Secret", "Pod"}
    assert schema_errors(manifests) == []


def test_what_is_rendered() -> None:
    kinds = sorted(f"{m['kind']}/{m['metadata']['name']}" for m in render(ROOT))
    assert kinds == [
        "ConfigMap/shellbox-settings",
        "DaemonSet/shellbox-node",
        "Deployment/shellbox-api",
        "NetworkPolicy/shellbox-node",
        "NetworkPolicy/shellbox-postgres",
        "PodDisruptionBudget/shellbox-api",
        "Service/shellbox-api",
        "Service/shellbox-node",
        "Service/shellbox-postgres",
        "StatefulSet/shellbox-postgres",
    ]
    assert {m["metadata"]["namespace"] for m in render(ROOT)} == {"shellbox"}
    api = next(m for m in render(ROOT) if m["kind"] == "Deployment")
    assert api["spec"]["replicas"] == 2
    probe = api["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"


def test_no_manifest_is_left_unchecked() -> None:
    """Every YAML file under deploy/kubernetes is in a kustomization or in extras/."""
    covered = set().union(*(referenced_files(d) for d in KUSTOMIZATIONS))
    covered |= set(EXTRAS.glob("*.yaml"))
    assert set(ROOT.rglob("*.yaml")) == covered


def test_names_meet() -> None:
    assert reference_errors(everything()) == []


def container(kind: str) -> dict:
    workload = next(m for m in render(ROOT) if m["kind"] == kind)
    return dict(workload["spec"]["template"]["spec"]["containers"][0])


def test_the_nodes_serve_tls_and_the_replicas_check_it() -> None:
    """The node serves https with the Secret's certificate and key and advertises an https
    URL; the replicas check it against the Secret's CA. Every setting the pods get exists, and
    the files they name are mounted, keys at a mode the node takes (setting_errors); a node
    serving with them: test_kubernetes_node_tls.py."""
    assert setting_errors(everything()) == []
    node, api = container("DaemonSet"), container("Deployment")
    node_env = {e["name"]: e.get("value") for e in node["env"]}
    assert node_env["SHELLBOX_CLUSTER__TLS_CERT_FILE"] == "/etc/shellbox/tls/tls.crt"
    assert node_env["SHELLBOX_CLUSTER__TLS_KEY_FILE"] == "/etc/shellbox/tls/tls.key"
    (advertise,) = [a for a in node["args"] if a.startswith("--advertise=")]
    assert advertise.startswith("--advertise=https://")
    assert node["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    api_env = {e["name"]: e.get("value") for e in api["env"]}
    assert api_env["SHELLBOX_CLUSTER__NODE_CA_FILE"] == "/etc/shellbox/node-ca/ca.crt"
    assert "SHELLBOX_CLUSTER__TLS_KEY_FILE" not in api_env


def test_only_the_api_reaches_the_nodes() -> None:
    policy = next(
        m for m in render(ROOT) if m["kind"] == "NetworkPolicy" and "node" in m["metadata"]["name"]
    )
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert peer == {
        "podSelector": {
            "matchLabels": {
                "app.kubernetes.io/name": "shellbox",
                "app.kubernetes.io/component": "api",
            }
        }
    }


def test_no_secret_value_is_committed() -> None:
    for m in everything():
        if m["kind"] == "Secret":
            assert m.get("data") is None
            for value in m["stringData"].values():
                assert "REPLACE" in value


# A broken copy must fail: each breakage is one a person could make, and each is caught by a
# different check (strict schema, types, required fields, cross references, the renderer).
BREAKAGES = {
    "misspelt field": ("base/node-daemonset.yaml", "volumeMounts:", "volumeMount:", "schema"),
    "wrong type": ("base/api-deployment.yaml", "replicas: 2", "replicas: two", "schema"),
    "missing selector": (
        "base/api-poddisruptionbudget.yaml",
        "  selector:\n    matchLabels:",
        "  unused:\n    matchLabels:",
        "schema",
    ),
    "mount of no volume": (
        "base/node-daemonset.yaml",
        "- name: uid-ranges\n              mountPath",
        "- name: uid-range\n              mountPath",
        "references",
    ),
    "service selects nothing": (
        "base/api-service.yaml",
        "app.kubernetes.io/component: api\n  ports",
        "app.kubernetes.io/component: apl\n  ports",
        "references",
    ),
    "unknown secret key": ("base/api-deployment.yaml", "key: url", "key: uri", "references"),
    "misspelt setting": (
        "base/node-daemonset.yaml",
        "name: SHELLBOX_CLUSTER__TLS_CERT_FILE",
        "name: SHELLBOX_CLUSTER__TLS_CERTFILE",
        "settings",
    ),
    "setting names no mounted file": (
        "base/api-deployment.yaml",
        "value: /etc/shellbox/node-ca/ca.crt",
        "value: /etc/shellbox/node-ca/ca.pem",
        "settings",
    ),
    "node key readable by its group": (
        "base/node-daemonset.yaml",
        "secretName: shellbox-node-tls\n            defaultMode: 0400",
        "secretName: shellbox-node-tls\n            defaultMode: 0440",
        "settings",
    ),
    "unhandled kustomize field": (
        "base/kustomization.yaml",
        "namespace: shellbox",
        "namespace: shellbox\nnamePrefix: x-",
        "render",
    ),
}


@pytest.mark.parametrize("name", sorted(BREAKAGES))
def test_a_broken_copy_fails(name: str, tmp_path: Path) -> None:
    relative, old, new, check = BREAKAGES[name]
    copy = tmp_path / "kubernetes"
    shutil.copytree(ROOT, copy)
    path = copy / relative
    text = path.read_text()
    assert text.count(old) >= 1, f"{relative} no longer holds {old!r}: update the breakage"
    path.write_text(text.replace(old, new, 1))
    assert schema_errors(render(ROOT)) == []  # the original still passes
    if check == "render":
        with pytest.raises(RenderError, match="namePrefix"):
            render(copy)
        return
    manifests = everything(copy)
    if check == "schema":
        errors = schema_errors(manifests)
    elif check == "references":
        assert schema_errors(manifests) == []
        errors = reference_errors(manifests)
    else:
        assert schema_errors(manifests) == [] and reference_errors(manifests) == []
        errors = setting_errors(manifests)
    assert errors, f"{name} was not caught"
