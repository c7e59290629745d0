"""Render deploy/kubernetes/ as ``kubectl apply -k`` would, and check it against the Kubernetes
schemas (``kubernetes-validate``) and against itself (names that must meet).

kustomize is not a Debian 12 package (``kubernetes-client`` there is kubectl 1.20, whose
kustomize 2.0.3 does not take directories under ``resources``), so the rendering is done here,
for the part of the Kustomization format the manifests use: ``resources`` (files and
directories) and ``namespace``. Any other field is refused with an error, never ignored, so
a manifest change that needs more fails here rather than being checked half-rendered.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

KUSTOMIZATION = "kustomization.yaml"
HANDLED = frozenset({"apiVersion", "kind", "resources", "namespace"})
# Kinds the namespace transformer leaves alone (the ones a manifest here could use).
CLUSTER_SCOPED = frozenset(
    {"Namespace", "ClusterRole", "ClusterRoleBinding", "PersistentVolume", "StorageClass"}
)
# The oldest Kubernetes still maintained when this was written, and the newest the pinned
# kubernetes-validate knows.
VERSIONS = ("1.35.0", "1.37.0")

Manifest = dict[str, Any]


class RenderError(Exception):
    pass


def render(directory: Path) -> list[Manifest]:
    """The manifests a kustomization directory stands for, in order."""
    path = directory / KUSTOMIZATION
    spec = yaml.safe_load(path.read_text())
    if not isinstance(spec, dict) or spec.get("kind") != "Kustomization":
        raise RenderError(f"{path}: not a Kustomization")
    unknown = sorted(set(spec) - HANDLED)
    if unknown:
        raise RenderError(
            f"{path}: {', '.join(unknown)}: not rendered by tests/deploy/k8s_manifests.py "
            f"(it handles {', '.join(sorted(HANDLED))}); extend it"
        )
    out: list[Manifest] = []
    for entry in spec.get("resources", []):
        target = directory / entry
        if target.is_dir():
            out.extend(render(target))
        elif target.is_file():
            out.extend(load(target))
        else:
            raise RenderError(f"{path}: resource {entry} does not exist")
    namespace = spec.get("namespace")
    if namespace:
        for manifest in out:
            if manifest.get("kind") not in CLUSTER_SCOPED:
                manifest.setdefault("metadata", {})["namespace"] = namespace
    seen: set[tuple[str, str, str]] = set()
    for manifest in out:
        key = identity(manifest)
        if key in seen:
            raise RenderError(f"{path}: {'/'.join(key)} is defined twice")
        seen.add(key)
    return out


def load(path: Path) -> list[Manifest]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict):
            raise RenderError(f"{path}: a document that is not a mapping")
    return docs


def identity(manifest: Manifest) -> tuple[str, str, str]:
    meta = manifest.get("metadata") or {}
    return (str(manifest.get("kind")), str(meta.get("namespace", "")), str(meta.get("name")))


def referenced_files(directory: Path) -> set[Path]:
    """Every file a kustomization pulls in, its own kustomization.yaml files included."""
    files = {directory / KUSTOMIZATION}
    spec = yaml.safe_load((directory / KUSTOMIZATION).read_text())
    for entry in spec.get("resources", []):
        target = directory / entry
        files |= referenced_files(target) if target.is_dir() else {target}
    return files


def schema_errors(manifests: Iterable[Manifest], versions: Iterable[str] = VERSIONS) -> list[str]:
    """What the Kubernetes schemas of each version reject (strict: unknown fields too)."""
    errors = []
    for manifest in manifests:
        for version in versions:
            error = _schema_error(json.dumps(manifest, sort_keys=True), version)
            if error is not None:
                errors.append(f"{'/'.join(identity(manifest))} ({version}) {error}")
    return errors


@functools.lru_cache(maxsize=512)
def _schema_error(manifest_json: str, version: str) -> str | None:
    """One manifest against one version's schema (the same manifest recurs across tests)."""
    try:
        kubernetes_validate.validate(json.loads(manifest_json), version, strict=True)
    except kubernetes_validate.ValidationError as exc:
        return f"{'.'.join(str(p) for p in exc.path)}: {exc.message}"
    except kubernetes_validate.SchemaNotFoundError as exc:
        return str(exc)
    return None


@dataclass(frozen=True)
class PodOwner:
    manifest: Manifest

    @property
    def name(self) -> str:
        return "/".join(identity(self.manifest))

    @property
    def pod(self) -> dict[str, Any]:
        if self.manifest["kind"] == "Pod":
            return dict(self.manifest)
        return dict(self.manifest["spec"]["template"])

    @property
    def labels(self) -> dict[str, str]:
        return dict((self.pod.get("metadata") or {}).get("labels") or {})

    def containers(self) -> list[dict[str, Any]]:
        spec = self.pod["spec"]
        return [*spec.get("initContainers", []), *spec.get("containers", [])]


WORKLOADS = frozenset({"Deployment", "DaemonSet", "StatefulSet", "Pod"})


def matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        present = expr["key"] in labels
        if expr["operator"] == "In" and labels.get(expr["key"]) not in expr["values"]:
            return False
        if expr["operator"] == "NotIn" and labels.get(expr["key"]) in expr["values"]:
            return False
        if expr["operator"] == "Exists" and not present:
            return False
        if expr["operator"] == "DoesNotExist" and present:
            return False
    return True


def reference_errors(manifests: list[Manifest]) -> list[str]:
    """Names that must meet and that no schema checks: a workload's selector and its pods'
    labels, a Service's or policy's selector and some pods, volume mounts and volumes, named
    ports, and the Secrets and ConfigMaps (and their keys) the pods read."""
    errors = []
    owners = [PodOwner(m) for m in manifests if m.get("kind") in WORKLOADS]
    data: dict[tuple[str, str], set[str]] = {}
    for m in manifests:
        if m.get("kind") in ("Secret", "ConfigMap"):
            keys = set(m.get("data") or {}) | set(m.get("stringData") or {})
            data[(m["kind"], m["metadata"]["name"])] = keys
    for owner in owners:
        if owner.manifest["kind"] != "Pod":
            selector = owner.manifest["spec"]["selector"]
            if not matches(selector, owner.labels):
                errors.append(f"{owner.name}: its selector does not select its own pods")
        spec = owner.pod["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        claims = owner.manifest.get("spec", {}).get("volumeClaimTemplates", [])
        mountable = set(volumes) | {c["metadata"]["name"] for c in claims}
        for container in owner.containers():
            where = f"{owner.name} container {container['name']}"
            ports = {p.get("name") for p in container.get("ports", [])}
            for mount in container.get("volumeMounts", []):
                if mount["name"] not in mountable:
                    errors.append(f"{where}: mounts volume {mount['name']}, which is not defined")
            for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                for action in ("httpGet", "tcpSocket"):
                    port = (container.get(probe) or {}).get(action, {}).get("port")
                    if isinstance(port, str) and port not in ports:
                        errors.append(f"{where}: {probe} names port {port}, which it lacks")
            for env in container.get("env", []):
                for kind, ref in (
                    ("Secret", (env.get("valueFrom") or {}).get("secretKeyRef")),
                    ("ConfigMap", (env.get("valueFrom") or {}).get("configMapKeyRef")),
                ):
                    if ref and ref["key"] not in data.get((kind, ref["name"]), set()):
                        errors.append(f"{where}: {kind} {ref['name']} has no key {ref['key']}")
            for source in container.get("envFrom", []):
                ref = source.get("configMapRef")
                if ref and ("ConfigMap", ref["name"]) not in data:
                    errors.append(f"{where}: no ConfigMap {ref['name']}")
        for volume in volumes.values():
            secret = volume.get("secret")
            if secret:
                keys = data.get(("Secret", secret["secretName"]))
                if keys is None:
                    errors.append(f"{owner.name}: no Secret {secret['secretName']}")
                    continue
                for item in secret.get("items", []):
                    if item["key"] not in keys:
                        errors.append(
                            f"{owner.name}: Secret {secret['secretName']} has no key {item['key']}"
                        )
    for m in manifests:
        kind, name = m.get("kind"), "/".join(identity(m))
        if kind == "Service" and m["spec"].get("selector"):
            selector = {"matchLabels": m["spec"]["selector"]}
            selected = [o for o in owners if matches(selector, o.labels)]
            if not selected:
                errors.append(f"{name}: its selector matches no pods")
            for port in m["spec"].get("ports", []):
                target = port.get("targetPort")
                if isinstance(target, str) and not any(
                    target in {p.get("name") for c in o.containers() for p in c.get("ports", [])}
                    for o in selected
                ):
                    errors.append(f"{name}: targetPort {target} is no port of its pods")
        if kind in ("NetworkPolicy", "PodDisruptionBudget"):
            selector = m["spec"].get("podSelector") or m["spec"].get("selector") or {}
            if not any(matches(selector, o.labels) for o in owners):
                errors.append(f"{name}: its selector matches no pods")
    return errors
