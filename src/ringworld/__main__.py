"""``python -m ringworld ...`` is the ``ringworld`` command."""

import sys

from ringworld.launch.cli import main

if __name__ == "__main__":
    sys.exit(main())
