"""
Integration tests: loopback sockets and real processes (amp, its workers, the
deploy tools, the image, the benchmark's quick runs).
"""
