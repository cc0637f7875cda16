"""amp's benchmark and soak: harnesses that run amp as a real process (see bench/README.md)."""
