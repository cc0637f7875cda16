"""
What amp needs of its MutatingWebhookConfiguration, from its config (pure):
L{Needs}, and the closed vocabulary of what can be wrong with it
(L{RegistrationProblem}) with L{Problem}, one found.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Optional

from amp.config import Config
from amp.deadline import review_budget
from amp.reasons import FailurePolicy
from amp.rules import protected_namespaces

__all__ = ["Needs", "Problem", "RegistrationProblem", "needs"]


class RegistrationProblem(StrEnum):
    """
    What can be wrong with amp's registration: the C{problem} label of
    C{amp_registration_problems}, each a section of docs/troubleshooting.md.
    """

    #: The configuration named C{kubernetes.webhook_configuration} does not exist.
    CONFIGURATION_MISSING = "configuration-missing"
    #: No entry is named C{kubernetes.webhook_name} (the one C{failure_policy: auto} follows).
    DEFAULT_ENTRY_MISSING = "default-entry-missing"
    #: Enabled namespaces of a class (or without the label) are sent to amp by no entry.
    CLASS_NOT_CALLED = "class-not-called"
    #: The entry that sends a class's namespaces has the other failurePolicy.
    CLASS_NOT_ENFORCED = "class-not-enforced"
    #: Namespaces without the label are sent by another entry than the one amp follows.
    DEFAULT_ENTRY_DIFFERS = "default-entry-differs"
    #: More than one entry sends the same namespaces: each Pod is reviewed twice.
    ENTRIES_OVERLAP = "entries-overlap"
    #: An entry sends Pods of amp's own namespace, kube-system or a protected namespace.
    SELECTS_PROTECTED = "selects-protected-namespace"
    #: timeoutSeconds less deadline.margin is shorter than an endpoint's timeout.
    TIMEOUT_BELOW_ENDPOINTS = "timeout-below-endpoints"
    #: deadline.default_timeout is not the entry's timeoutSeconds.
    DEADLINE_DIFFERS = "deadline-differs"
    #: No rule sends Pod creations (or, with ephemeral_containers, kubectl debug).
    RULES_MISSING = "rules-missing"
    #: A rule sends requests amp answers unchanged without looking.
    RULES_EXTRA = "rules-extra"
    #: sideEffects is not None or NoneOnDryRun: dry runs are refused.
    SIDE_EFFECTS = "side-effects"
    #: The entries' reinvocationPolicy differ: one class is reviewed differently.
    REINVOCATION_DIFFERS = "reinvocation-differs"
    #: The entry calls a path other than /mutate.
    WRONG_PATH = "wrong-path"
    #: admissionReviewVersions has neither v1 nor v1beta1.
    REVIEW_VERSIONS = "review-versions"
    #: The caBundle is empty for a Service, or holds no certificate.
    CA_BUNDLE_MISSING = "ca-bundle-missing"
    #: No CA of the caBundle signed the certificate amp serves (or it has expired).
    CA_BUNDLE_MISMATCH = "ca-bundle-mismatch"
    #: The certificate amp serves does not name the Service the entry calls.
    CERTIFICATE_NAME = "certificate-name"


@dataclass(frozen=True, slots=True, order=True)
class Problem:
    """One thing wrong with the registration: its C{name} and what, in words."""

    name: RegistrationProblem
    message: str

    def __str__(self) -> str:
        return f"{self.name}: {self.message}"


@dataclass(frozen=True, slots=True)
class Needs:
    """
    What amp's config needs of its registration.

    @ivar configuration: the configuration's name (C{kubernetes.webhook_configuration}).
    @ivar default_entry: the entry C{failure_policy: auto} follows
        (C{kubernetes.webhook_name}), or None (the first).
    @ivar class_label: the failure-class label, or None (a single entry).
    @ivar failure_policy: the config's C{failure_policy} (C{auto}, C{Ignore}, C{Fail}).
    @ivar excluded: namespaces no entry may send: amp's own (when known)
        and the protected ones; empty with C{allow_protected_namespaces}.
    @ivar own_namespace: amp's own namespace, when known.
    @ivar margin: C{deadline.margin}.
    @ivar default_timeout: C{deadline.default_timeout}.
    @ivar endpoint_timeouts: the timeout of endpoint calls, by where it is set.
    @ivar ephemeral: C{ephemeral_containers}: kubectl debug is reviewed too.
    """

    configuration: str
    default_entry: Optional[str]
    class_label: Optional[str]
    enabled_label: str
    enabled_value: str
    failure_policy: str
    excluded: tuple[str, ...]
    own_namespace: Optional[str]
    margin: float
    default_timeout: float
    endpoint_timeouts: tuple[tuple[str, float], ...]
    ephemeral: bool

    def budget(self, timeout_seconds: float) -> float:
        """amp's budget for a review the API server gives C{timeout_seconds}."""
        return review_budget(timeout_seconds, self.default_timeout, self.margin)


def needs(config: Config, own_namespace: Optional[str] = None) -> Needs:
    """
    What C{config} needs of its registration; C{own_namespace} (else
    C{kubernetes.own_namespace}) is amp's own namespace.
    """
    kube = config.kubernetes
    own = own_namespace or kube.own_namespace
    endpoints = config.endpoints
    timeouts = [("endpoints.timeout", endpoints.defaults.timeout)]
    timeouts += [(f"endpoints.overrides[{o.match.text}].timeout", o.settings.timeout) for o in endpoints.overrides]
    return Needs(
        configuration=kube.webhook_configuration or "",
        default_entry=kube.webhook_name,
        class_label=kube.failure_class_label,
        enabled_label=kube.enabled_label,
        enabled_value=kube.enabled_value,
        failure_policy=str(config.failure_policy),
        excluded=tuple(sorted(protected_namespaces(kube, own))),
        own_namespace=own,
        margin=config.deadline.margin,
        default_timeout=config.deadline.default_timeout,
        endpoint_timeouts=tuple(timeouts),
        ephemeral=config.ephemeral_containers,
    )


#: The failure classes, in the order they are checked.
CLASSES = (FailurePolicy.FAIL.value, FailurePolicy.IGNORE.value)
