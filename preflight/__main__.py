"""`python -m preflight`: the `ddp-preflight` command."""

import sys

from cli.ddp_preflight import main

sys.exit(main())
