"""Where sandboxes live: the ``Runtime`` protocol and its OCI (crun/runc) implementation."""

from __future__ import annotations

import sys
from typing import TextIO

from shellbox.sandbox.base import (
    ByteSource,
    CommandFinished,
    CommandResult,
    CommandStarted,
    ContainerSpec,
    ExecEvent,
    ExecRequest,
    FileInfo,
    Mount,
    NetworkAttachment,
    NetworkSpec,
    Outcome,
    OutputDelta,
    PatchResult,
    Runtime,
    RuntimeInfo,
    SandboxInfo,
    SandboxNetwork,
    SecretInjection,
    SkillMount,
)
from shellbox.sandbox.crun import OciRuntime
from shellbox.sandbox.idmap import UidRanges
from shellbox.sandbox.image import ensure_image
from shellbox.sandbox.storage import StorageConfig
from shellbox.settings import Settings

__all__ = [
    "ByteSource",
    "CommandFinished",
    "CommandResult",
    "CommandStarted",
    "ContainerSpec",
    "ExecEvent",
    "ExecRequest",
    "FileInfo",
    "Mount",
    "NetworkAttachment",
    "NetworkSpec",
    "OciRuntime",
    "Outcome",
    "OutputDelta",
    "PatchResult",
    "Runtime",
    "RuntimeInfo",
    "SandboxInfo",
    "SandboxNetwork",
    "SecretInjection",
    "SkillMount",
    "create_runtime",
    "storage_config",
    "uid_ranges",
]


def create_runtime(
    settings: Settings, *, out: TextIO | None = None, network: SandboxNetwork | None = None
) -> OciRuntime:
    """The runtime the settings ask for, building the sandbox image first if it is missing;
    ``network`` serves its containers that have a ``NetworkSpec`` (egress)."""
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    image = ensure_image(
        settings.image_dir(), settings.runtime.image_profile, out=out or sys.stderr
    )
    return OciRuntime(
        settings.state_dir,
        image.path,
        binary=settings.runtime.type,
        seccomp=settings.runtime.seccomp,
        storage_config=storage_config(settings),
        uid_ranges=uid_ranges(settings),
        network=network,
    )


def storage_config(settings: Settings) -> StorageConfig:
    s = settings.storage
    return StorageConfig(
        backend=s.backend, device=s.device, size_gb=s.size_gb, quota_mode=s.quota_mode
    )


def uid_ranges(settings: Settings) -> UidRanges:
    """The host-wide pool of container uid ranges the settings describe."""
    rt = settings.runtime
    return UidRanges(rt.uid_range_first, rt.uid_range_count, rt.uid_claims_dir)
