"""`python -m rdurack.devtools.chaos` (`make chaos`): main.py's `main`."""

import sys

from rdurack.devtools.chaos.main import main

sys.exit(main())
