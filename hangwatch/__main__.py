"""`python -m hangwatch`: the `hangwatch` command."""

import sys

from cli.hangwatch import main

sys.exit(main())
