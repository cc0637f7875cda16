from twisted.application.service import ServiceMaker

ampExample = ServiceMaker(
    "amp-example", "amp_examples.server", "Example amp mutation endpoints (plain HTTP).", "amp-example"
)
