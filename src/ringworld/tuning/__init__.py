"""Topology-free tuning: the cost model, its measured constants, and algorithm choice."""
