"""The request's sandbox: which container hosted calls run in, and what the model is told
about it (the container, its network, the skills mounted in it).

``container_auto`` creates a container for the request, or keeps using the one the previous
response ran in (``previous_response_id``) while it lives. Its network policy is fixed when
it starts, so asking for another one on that warm container is a 409 that is not retried.
"""

from __future__ import annotations

from typing import Any

from shellbox.errors import Conflict, ContainerNotFound, ContainerNotRunning
from shellbox.responses.tools import ToolSet
from shellbox.service.containers import LIVE, ContainerService, CreateContainer
from shellbox.service.models import ContainerRecord, Principal

SKILLS_ROOT = "/mnt/skills"


def _policy_key(policy: dict[str, Any]) -> tuple[str, tuple[str, ...]]:
    domains = policy.get("allowed_domains") or []
    return str(policy.get("type", "disabled")), tuple(sorted({d.lower() for d in domains}))


def _describe_policy(policy: dict[str, Any]) -> str:
    kind, domains = _policy_key(policy)
    if kind == "allowlist":
        return f"allowlist of {', '.join(domains) or 'no domains'}"
    return kind


async def resolve_container(
    containers: ContainerService,
    principal: Principal,
    tools: ToolSet,
    *,
    previous_container: str | None,
    name: str,
) -> ContainerRecord | None:
    env = tools.environment
    if env is None:
        return None
    if env["type"] == "container_reference":
        referenced = containers.get(principal, env["container_id"])
        if referenced.status not in LIVE:
            msg = f"container {referenced.id} has {referenced.status}; create a new one"
            raise ContainerNotRunning(msg, param="tools")
        return referenced
    if previous_container:
        record: ContainerRecord | None
        try:
            record = containers.get(principal, previous_container)
        except ContainerNotFound:
            record = None
        if record is not None and record.status in LIVE:
            if _policy_key(record.network_policy) != _policy_key(env["network_policy"]):
                msg = (
                    f"container {record.id} (from previous_response_id) started with network "
                    f"policy {_describe_policy(record.network_policy)}; a warm container's "
                    "policy cannot change. Send the same network_policy, or start a new "
                    "conversation for a new container."
                )
                raise Conflict(msg, param="tools")
            return record
    return await containers.create(
        principal,
        CreateContainer(
            name=name,
            memory_limit=env["memory_limit"],
            file_ids=env["file_ids"],
            network_policy=env["network_policy"],
            skills=env["skills"],
        ),
    )


def _skill_lines(skills: list[dict[str, Any]], default_root: str | None) -> list[str]:
    lines = []
    for s in skills:
        name = str(s.get("name") or "skill")
        path = s.get("path") or (f"{default_root}/{name}" if default_root else name)
        desc = str(s.get("description") or "No description provided.")
        lines.append(f"- {name}: {desc} (directory: {path})")
    return lines


def environment_note(tools: ToolSet, container: ContainerRecord | None) -> str | None:
    """What the model is told about where its shell runs, and the skills it can use."""
    lines: list[str] = []
    if container is not None:
        policy = container.network_policy
        kind, domains = _policy_key(policy)
        network = (
            f"It can reach only these hosts: {', '.join(domains)}."
            if kind == "allowlist"
            else "It has no network access."
        )
        lines.append(
            "The shell tool runs commands in a sandboxed Linux (Debian) container, as an "
            "unprivileged user, with /mnt/data as the working directory. Files saved under "
            "/mnt/data stay between calls and are shared with the user: name the files you "
            f"create for them. {network}"
        )
        skills = _skill_lines(container.skills, SKILLS_ROOT)
    else:
        skills = _skill_lines(tools.local_skills, None)
    if skills:
        lines.append("Skills are available; before using one, read the SKILL.md in its directory:")
        lines.extend(skills)
    return "\n".join(lines) if lines else None


def compose_instructions(instructions: str | None, note: str | None) -> str | None:
    parts = [p for p in (instructions, note) if p]
    return "\n\n".join(parts) if parts else None
