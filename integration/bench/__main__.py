"""``python -m rayledger.integration.bench WHICH [--json] [--quick]`` = ``rayledger bench ...``."""

import sys

from ..cli.main import main

sys.exit(main(["bench", *sys.argv[1:]]))
