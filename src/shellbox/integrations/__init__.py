"""Adapters that put shellbox under other frameworks; each needs its own extra installed.

``shellbox.integrations.agents`` needs the OpenAI Agents SDK (``pip install shellbox[agents]``).
Nothing in the core imports this package.
"""
