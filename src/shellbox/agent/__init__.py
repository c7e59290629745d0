"""The in-container exec agent (``server``) and the host side that talks to it (``client``).

``protocol`` is shared by both sides and, like ``server``, uses the standard library only:
the container's own python3 runs these two files straight from a read-only mount.
"""
