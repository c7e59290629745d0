"""The server-side shell tool loop behind ``POST /v1/responses`` and ``POST /v1/messages``:
any model behind an OpenAI-compatible endpoint gets a hosted shell.

The composition root (``services.py``) builds the ``ResponsesService``; the routes are in
``api/routes/responses.py`` and ``api/routes/messages.py``.
"""
