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
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from shellbox.settings import Settings

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


ENV_PREFIX = "SHELLBOX_"
# The settings naming a file shellbox reads only if no one but its owner can (mode 0600 or
# stricter: sandbox/remote.py read_private_file, egress/sealing.py).
PRIVATE_FILES = frozenset({"cluster.key_file", "cluster.tls_key_file", "egress.secrets_key_file"})
SECRET_FILE_MODE = 0o644  # a Secret volume's defaultMode when it sets none


def setting_of(env_name: str) -> tuple[str, FieldInfo] | None:
    """The setting an environment variable sets (``SHELLBOX_<SECTION>__<KEY>``), as
    ``section.key`` and its field; None if it names none (or names a whole section)."""
    if not env_name.startswith(ENV_PREFIX):
        return None
    parts = env_name.removeprefix(ENV_PREFIX).lower().split("__")
    model: type[BaseModel] | None = Settings
    field = None
    for part in parts:
        if model is None:
            return None
        field = model.model_fields.get(part)
        if field is None:
            return None
        annotation = field.annotation
        is_section = isinstance(annotation, type) and issubclass(annotation, BaseModel)
        model = annotation if is_section else None
    if model is not None or field is None:
        return None
    return ".".join(parts), field


def container_settings(
    container: dict[str, Any], config_maps: dict[str, dict[str, str]]
) -> dict[str, str | None]:
    """The ``SHELLBOX_*`` variables a container gets: their literal values, None for those
    from a Secret or the pod's fields."""
    out: dict[str, str | None] = {}
    for source in container.get("envFrom", []):
        ref = source.get("configMapRef")
        if ref:
            out.update(config_maps.get(ref["name"], {}))
    for env in container.get("env", []):
        out[env["name"]] = env.get("value")
    return {k: v for k, v in out.items() if k.startswith(ENV_PREFIX)}


def mounted_item(
    pod: dict[str, Any], container: dict[str, Any], path: str
) -> tuple[dict[str, Any], int] | None:
    """The Secret or ConfigMap volume item that is file ``path`` in the container, and the
    mode the kubelet gives it; None if no such volume item is there."""
    volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        prefix = mount["mountPath"].rstrip("/") + "/"
        if not path.startswith(prefix):
            continue
        volume = volumes.get(mount["name"], {})
        source = volume.get("secret") or volume.get("configMap")
        if source is None:
            continue
        rel = path.removeprefix(prefix)
        for item in source.get("items", []):
            if item["path"] == rel:
                return item, item.get("mode", source.get("defaultMode", SECRET_FILE_MODE))
    return None


def setting_errors(manifests: list[Manifest]) -> list[str]:
    """What the settings the pods are given get wrong, which neither the schemas nor
    ``reference_errors`` see: a ``SHELLBOX_*`` variable that is no setting; a file setting
    (``*_file``) naming a path no mounted Secret item is; a private one (a key) that the
    process could not take (mode readable by group or others, an ``fsGroup``, which makes the
    files group-readable, or a non-root user, who cannot read root's 0400 file); a node
    serving TLS whose probes speak plain HTTP."""
    errors = []
    config_maps = {
        m["metadata"]["name"]: dict(m.get("data") or {})
        for m in manifests
        if m.get("kind") == "ConfigMap"
    }
    for owner in (PodOwner(m) for m in manifests if m.get("kind") in WORKLOADS):
        pod = owner.pod
        pod_security = pod["spec"].get("securityContext") or {}
        init = {c["name"] for c in pod["spec"].get("initContainers", [])}
        for container in owner.containers():
            where = f"{owner.name} container {container['name']}"
            user = (container.get("securityContext") or {}).get(
                "runAsUser", pod_security.get("runAsUser", 0)
            )
            values = container_settings(container, config_maps)
            if container["name"] in init:
                # A one-off command (the node's `shellbox image build`) that opens no key:
                # the file settings the ConfigMap gives every pod are not its own to mount.
                own = {e["name"] for e in container.get("env", [])}
                values = {k: v for k, v in values.items() if k in own or setting_of(k) is None}
            for name, value in sorted(values.items()):
                found = setting_of(name)
                if found is None:
                    errors.append(f"{where}: {name} is no setting (src/shellbox/settings.py)")
                    continue
                setting, _ = found
                if not setting.endswith("_file") or value is None:
                    continue
                mounted = mounted_item(pod, container, value)
                if mounted is None:
                    errors.append(f"{where}: {name}={value}: no mounted Secret item is there")
                    continue
                _, mode = mounted
                if setting in PRIVATE_FILES:
                    if mode & 0o077:
                        errors.append(f"{where}: {value} ({setting}) is mode {mode:04o}")
                    if "fsGroup" in pod_security:
                        errors.append(f"{where}: fsGroup makes {value} ({setting}) readable")
                    if user != 0:
                        errors.append(f"{where}: uid {user} cannot read {value} ({setting})")
                elif user != 0 and not mode & 0o004:
                    errors.append(f"{where}: uid {user} cannot read {value} ({setting})")
            if values.get("SHELLBOX_CLUSTER__TLS_CERT_FILE"):
                for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
                    get = (container.get(probe) or {}).get("httpGet")
                    if get and get.get("scheme", "HTTP") != "HTTPS":
                        errors.append(f"{where}: serves https, but its {probe} speaks http")
    return errors
