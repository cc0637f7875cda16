"""
amp's development tools, not part of amp: ``devcert`` (a development CA and
certificates) and ``demo`` (``make demo``).
"""
