"""
amp's Kubernetes sources: a warm cache of every Namespace's labels and
annotations (and the failurePolicy of amp's own webhook), kept current by
list/watch loops that run in threads of their own.

The package is split along the one boundary that matters, the reactor
thread:

  - thread side: L{amp.kube._client} (the synchronous C{kubernetes} client,
    its sockets, the blocking calls) and L{amp.kube._watch} (the list/watch
    loop: resume, relist on 410 Gone, backoff with jitter, stop);
  - the crossing: L{amp.kube._events} (typed, immutable news) and
    L{amp.kube._bridge} (the one C{reactor.callFromThread});
  - reactor side: L{amp.kube._source} (the cache, the service),
    L{amp.kube._misses} (cache misses through the reactor's thread pool),
    and the bypassed-Pod report:
    L{amp.kube._report} (its terms), L{amp.kube._lease} (the Lease that
    picks the reporting replica), L{amp.kube._bypass} (the reporter);
  - pure: L{amp.kube._keep} (what is kept of each object, parsed in the
    threads) and L{amp.kube._verdict} (whether a Pod bypassed amp, and the
    Event that records it).

Only the reactor thread reads or writes the cache.  Only what amp reads is
kept: the enable label, amp's annotations and the resourceVersion, never
whole objects.
"""

from amp.kube._client import KubeClient, describe, load_client_configuration
from amp.kube._keep import webhook_failure_policy
from amp.kube._lease import LeaseElector
from amp.kube._source import STOP_WAIT, KubernetesNamespaceSource
from amp.kube._watch import backoff_delay

__all__ = [
    "STOP_WAIT",
    "KubeClient",
    "KubernetesNamespaceSource",
    "LeaseElector",
    "backoff_delay",
    "describe",
    "load_client_configuration",
    "webhook_failure_policy",
]
