"""The HTTP layer: FastAPI routers that parse the wire format and call the service layer."""
