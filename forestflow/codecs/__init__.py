"""Payload <-> Frame conversions, one module per format."""
