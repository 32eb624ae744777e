"""The protocol-free core: ids, the Frame, policies, routers and contract state (no I/O)."""
