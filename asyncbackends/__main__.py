"""``python -m asyncbackends``: the same as the ``asyncbackends`` command."""

import sys

from ._cli.main import main

sys.exit(main())
