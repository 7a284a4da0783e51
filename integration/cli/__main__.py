"""``python -m rayledger.integration.cli``."""

import sys

from .main import main

sys.exit(main())
