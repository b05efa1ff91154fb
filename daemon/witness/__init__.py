"""Witnessing signed heads: the daemon's publisher and the `bide witness` service."""
