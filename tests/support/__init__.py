"""What the tests share: builders, harnesses and the fakes, each module named for the layer it fakes."""
