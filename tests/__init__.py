"""amp's test suite: unit, integration (loopback) and end-to-end tests, and the helpers they share."""
