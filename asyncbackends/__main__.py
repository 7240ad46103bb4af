"""``python -m asyncbackends``: the same as the ``asyncbackends`` command."""

import sys

from .cli import main

sys.exit(main())
