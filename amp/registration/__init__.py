"""
amp's registration: what amp needs of its MutatingWebhookConfiguration
(L{needs}, from its config), the check of one against it (L{check}, pure:
the named problems, L{Problem} of the vocabulary L{RegistrationProblem}),
and the daemon's report of the one in the cluster (L{RegistrationReport}:
one log line per change, C{amp_registration_problems}).  C{amp check}
(L{amp.cli.check}) runs the same check against the cluster or a rendered
manifest.

  - pure: L{amp.registration._needs} (what amp needs, the vocabulary),
    L{amp.registration._desired} (the object the managed mode applies, and
    its drift),
    L{amp.registration._check} (the check: selectors judged on probe
    namespaces, timeouts, rules, sideEffects, reinvocationPolicy, caBundle);
  - reactor side: L{amp.registration._report}, and the managed mode's
    L{amp.registration._keeper} (the Lease holder applies and repairs it);
  - amp's own CA and serving certificate (C{registration.secret}): pure,
    L{amp.registration._pki} (making them, the Secret's content, the
    replicas' reports) and L{amp.registration._rotation} (the next step);
    reactor side, L{amp.registration._secret} (every replica serves the
    Secret's pair and reports it; the Lease holder rotates).
"""

from amp.registration._check import bundle_certificates, check, selects, verifies
from amp.registration._desired import desired, drifted
from amp.registration._keeper import RegistrationKeeper
from amp.registration._needs import Needs, Problem, RegistrationProblem, needs
from amp.registration._report import RegistrationReport
from amp.registration._secret import SecretCertificates

__all__ = [
    "Needs",
    "Problem",
    "RegistrationKeeper",
    "RegistrationProblem",
    "RegistrationReport",
    "SecretCertificates",
    "bundle_certificates",
    "check",
    "desired",
    "drifted",
    "needs",
    "selects",
    "verifies",
]
