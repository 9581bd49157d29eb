"""`python -m ddp_preflight`: the `ddp-preflight` command."""

import sys

from ddp_preflight.cli.ddp_preflight import main

sys.exit(main())
