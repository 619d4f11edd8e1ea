"""Starting jobs: the ``ringworld`` command line, the process set, and failure reports.

Kept free of heavy imports so ``ringworld run`` starts fast.
"""
