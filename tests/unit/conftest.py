"""
What every unit test gets: no network (L{tests.support.network_guard}).
The root tests/conftest.py's settings and xdist groups apply here too.
"""

from tests.support.network_guard import no_network

__all__ = ["no_network"]
