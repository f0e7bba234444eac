"""``python -m luminal ...`` is the ``luminal`` command."""

import sys

from .cli import main

sys.exit(main())
