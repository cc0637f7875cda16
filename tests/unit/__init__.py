"""Unit tests: pure logic and in-memory I/O (a Clock, StringTransport, MemoryReactor), by area of amp."""
