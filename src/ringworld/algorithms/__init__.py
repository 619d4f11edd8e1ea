"""Collective algorithms as schedules (pure data), their registry, executor and simulator."""
