from twisted.application.service import ServiceMaker

ampExample = ServiceMaker(
    "amp-example", "amp.example_tap", "Example amp mutation endpoints (plain HTTP).", "amp-example"
)
