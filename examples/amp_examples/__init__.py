"""
Example endpoints for amp, one program per use case (see examples/README.md).

Each module ``amp_examples.<program>`` is one endpoint's business logic and
runs on its own (``python -m amp_examples.<program>``); ``serving`` and
``patching`` are what they share; ``server`` is every program on one port
(``twistd amp-example``). Nothing here is part of amp or imports it.
"""
