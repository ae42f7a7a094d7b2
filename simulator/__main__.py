"""`python -m simulator SCENARIO [--node-only | EXPORTER FLAGS...]`: the `kde-simulate` command."""

import sys

from simulator.runner import main

sys.exit(main())
