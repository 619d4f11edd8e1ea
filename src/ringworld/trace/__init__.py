"""Timeline tracing: every call of every rank in one Chrome/Perfetto trace file.

Turn it on with ``RINGWORLD_TRACE=trace.json`` or ``ringworld run --trace trace.json``; open the
file in ui.perfetto.dev. :mod:`ringworld.trace.recorder` records one rank's calls;
:mod:`ringworld.trace.merge` joins the ranks' parts into the trace file.
"""
