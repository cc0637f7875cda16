from twisted.application.service import ServiceMaker

amp = ServiceMaker("amp", "amp.tap", "Admission mutation proxy for Kubernetes.", "amp")
