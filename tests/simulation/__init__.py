"""Deterministic simulations of the protocol cores (no Ray, fake clock, seeded faults)."""
