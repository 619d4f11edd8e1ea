"""Topology: describe and discover machines, plan collectives on them, simulate at scale.

``model`` (devices, links, JSON), ``presets`` (``seed-pcie-4gpu``, ``dgx1v``, ``cluster:...``,
``fattree:...``), ``discover`` (/sys and nvidia-smi), ``routes``, ``program`` and ``sim`` (the
timing simulator of real schedules), ``plans``/``search``/``planner`` (topology-aware
schedules and the choice among them), ``calibrate`` and ``cli``. See ``docs/topology.md``.
"""
