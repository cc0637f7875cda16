"""
C{python -m amp.config PAGE...}: rewrite the key tables of each Markdown
PAGE (C{docs/config.md}) from the declarations of L{amp.config}.
"""

import sys
from pathlib import Path

from amp.config._reference import rewrite_reference

for name in sys.argv[1:]:
    page = Path(name)
    page.write_text(rewrite_reference(page.read_text()))
