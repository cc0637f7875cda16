"""C{python -m bench.soak}: run the soak (see L{bench.soak.driver})."""

import sys

from bench.soak.driver import main

sys.exit(main())
