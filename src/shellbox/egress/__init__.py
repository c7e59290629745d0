"""Domain-allowlisted egress: per-container network namespaces, the mitmproxy addon that
applies each container's policy and injects its ``domain_secrets``, and the audit."""
