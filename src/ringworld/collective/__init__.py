"""The collective API layer: the full :class:`Communicator` over algorithms and tuning."""
