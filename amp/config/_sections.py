"""
Every key of amp's configuration, declared once (pure): the sections of
C{etc/amp.yaml} as frozen dataclasses whose fields are declared with
L{declare} (kind, default, documentation, restart rule).  The loader
(L{amp.config._load}), the reference in C{docs/config.md} and the chart's
values schema all read these declarations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from amp.config._declare import Key, Restart, declare, declared_keys, section
from amp.config._values import (
    BOOL,
    DURATION,
    EXPRESSIONS,
    MAPPING,
    NETWORKS,
    NONNEG_INT,
    OPT_STR,
    OVERRIDES,
    POINTERS,
    PORT,
    POSITIVE_DURATION,
    POSITIVE_INT,
    POSITIVE_SIZE,
    RATIO,
    SHARE,
    STATIC_NAMESPACES,
    STR,
    STR_LIST,
    TLS_VERSION,
    URL_PATTERNS,
    choice,
)
from amp.patch import DEFAULT_DENIED
from amp.reasons import FailurePolicy, NamespaceSource
from amp.urls import EndpointURL, URLPattern


@dataclass(frozen=True)
class ListenConfig:
    port: int = declare(PORT, 8443, restart=Restart.ALWAYS, doc=(
        "TCP port of the HTTPS listener the API server calls (`/mutate`, `/validate`, `/healthz`, `/readyz`)."))
    interface: str = declare(STR, "0.0.0.0", restart=Restart.ALWAYS, doc=(
        "Address to listen on. An address containing `:` listens on IPv6 (`::` for every address)."))
    max_body: int = declare(POSITIVE_SIZE, 3 * 1024 * 1024, doc=(
        "Largest request body accepted. A larger one is refused with 413 as soon as its Content-Length (or, when "
        "chunked, the bytes received) says so, without reading it. The API server's own limit is 3 MiB."))
    max_connections: int = declare(POSITIVE_INT, 1024, doc=(
        "Connections open at once; a connection beyond this is closed at once (logged as `Connection refused: N "
        "connections open (listen.max_connections)`)."))
    request_timeout: float = declare(POSITIVE_DURATION, 10.0, doc=(
        "Time from a request's first byte to its last (for a connection's first request, from when the connection "
        "is accepted). It is not reset by each byte: a client that is slower gets 408 and the connection is closed."))
    idle_timeout: float = declare(POSITIVE_DURATION, 60.0, doc=(
        "An idle keep-alive connection is closed after this long from its last answer (and aborted 1 s later if the"
        " client does not take the close); bytes that begin no request (blank lines) do not restart it, and a "
        "client that has stopped reading its answers counts as idle."))
    drain_timeout: float = declare(POSITIVE_DURATION, 30.0, doc=(
        "Bound of a graceful shutdown (`SIGTERM`): `/readyz` fails and the listener closes at once, every review "
        "already received is answered (each within its own deadline), idle keep-alive connections are closed at "
        "once and the others after their answer (a connection yet to send its first review gets to send it, within "
        "`listen.request_timeout` of its accept); what is still open after this long is aborted and the process "
        "exits. The default is just above the longest review budget (the API server's longest `timeoutSeconds`, 30 "
        "s, less `deadline.margin`). With `workers`, worker 0 gives its workers this long plus 1 s before killing "
        "them. See [Shutdown and rollouts](operations.md#shutdown-and-rollouts)."))


@dataclass(frozen=True)
class TLSConfig:
    cert: str = declare(STR, "/etc/amp/tls/tls.crt", restart=Restart.ALWAYS, doc=(
        "PEM certificate chain, amp's certificate first. Must not be expired at start."))
    key: str = declare(STR, "/etc/amp/tls/tls.key", restart=Restart.ALWAYS, doc=(
        "Its unencrypted PEM private key."))
    client_ca: Optional[str] = declare(OPT_STR, None, restart=Restart.ALWAYS, doc=(
        "PEM file of the CA(s) that must have signed a client certificate. When set, every client must present one "
        "(configure the API server's admission client certificate); when `null`, clients are not asked for one. "
        "Note that the kubelet's HTTPS probes present no certificate."))
    min_version: str = declare(TLS_VERSION, "1.2", restart=Restart.ALWAYS, doc=(
        "Lowest TLS version accepted: `\"1.2\"` or `\"1.3\"` (quote it). TLS 1.2 uses ECDHE with AES-GCM or "
        "ChaCha20-Poly1305 only; TLS 1.3 prefers AES-128-GCM. No session is resumed (the API server never resumes "
        "one), so amp keeps no session cache and no ticket key."))
    reload_interval: float = declare(POSITIVE_DURATION, 5.0, restart=Restart.ALWAYS, doc=(
        "How often the certificate, key and client CA files are checked for a change. A new set is loaded only if "
        "it is complete, belongs together and has not expired; otherwise the certificate in service stays. `SIGHUP`"
        " reloads at once."))


@dataclass(frozen=True)
class MetricsConfig:
    port: int = declare(PORT, 9090, restart=Restart.ALWAYS, doc=(
        "Plain-HTTP port of `GET /metrics` ([metrics.md](metrics.md)). `0` turns the metrics listener off."))
    interface: str = declare(STR, "0.0.0.0", restart=Restart.ALWAYS, doc=(
        "Address of the metrics listener."))
    debug_reviews: int = declare(NONNEG_INT, 256, doc=(
        "How many recent decisions `GET /debug/reviews` on the metrics port serves "
        "([operations.md](operations.md#recent-decisions-debugreviews)). `0` keeps none and turns the endpoint off "
        "(404). Reloadable: a smaller size keeps the newest."))


@dataclass(frozen=True)
class StaticNamespace:
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class BypassConfig:
    """C{kubernetes.bypass}: the report of Pods admitted without amp's review."""

    enabled: bool = declare(BOOL, False, restart=Restart.KUBERNETES, doc=(
        "`true` (as in `deploy/`): report Pods admitted without amp's review "
        "([operations.md](operations.md#bypassed-pods)): a Pod watch (metadata only) on the replica holding the "
        "Lease, `amp_bypassed_pods_total`, a warning log line and an `AmpBypassed` Event per Pod. Needs the "
        "namespace watch (not `per_review_get`), `source: cluster` or `kubeconfig`, and the status stamp on "
        "(`annotate_status: true`). Restart-only."))
    horizon: float = declare(POSITIVE_DURATION, 3000.0, restart=Restart.KUBERNETES, doc=(
        "Only Pods created within this long before they are judged are reported: a restart reports what was created"
        " while amp was down, an upgrade or a namespace enabled long after its Pods does not flood Events. Keep it "
        "below the API server's `--event-ttl` (1 h unless set): the `AmpBypassed` Event is the record that a Pod "
        "was reported, and a Pod whose Event expired would be reported again."))
    lease_name: str = declare(STR, "amp-bypass-reporter", restart=Restart.KUBERNETES, doc=(
        "The `coordination.k8s.io/v1` Lease that picks the one reporting replica; `deploy/base/role.yaml` grants it"
        " by this name."))
    lease_namespace: Optional[str] = declare(OPT_STR, None, restart=Restart.KUBERNETES, doc=(
        "Where the Lease lives; `null` means amp's own namespace (`kubernetes.own_namespace`, in a cluster the "
        "namespace amp runs in). Required with `source: kubeconfig` unless `own_namespace` is set."))
    lease_duration: float = declare(POSITIVE_DURATION, 15.0, restart=Restart.KUBERNETES, doc=(
        "How long a reporter's Lease lasts without renewal. The leader renews every third of it and steps down "
        "after two thirds without a renewal; another replica takes over once it has seen no renewal for a whole "
        "duration."))


@dataclass(frozen=True)
class KubernetesConfig:
    source: NamespaceSource = declare(choice(NamespaceSource), NamespaceSource.CLUSTER, restart=Restart.ALWAYS, doc=(
        "`cluster`: the in-cluster service account. `kubeconfig`: the file in `kubernetes.kubeconfig`. `static`: no"
        " API server at all, the namespaces listed in `kubernetes.namespaces` (local runs and tests)."))
    kubeconfig: Optional[str] = declare(OPT_STR, None, restart=Restart.KUBERNETES, doc=(
        "Path of the kubeconfig file; required with `source: kubeconfig`."))
    context: Optional[str] = declare(OPT_STR, None, restart=Restart.KUBERNETES, doc=(
        "Context in the kubeconfig; `null` is its current context."))
    namespaces: Mapping[str, StaticNamespace] = declare(STATIC_NAMESPACES, {}, doc=(
        "Only with `source: static`: namespace name to `{labels: {...}, annotations: {...}}`, e.g. `team-a: "
        "{labels: {amp.txn2.com/enabled: \"true\"}, annotations: {amp.txn2.com/ep: "
        "\"http://127.0.0.1:8090/user-env\"}}`. A namespace not listed does not exist."))
    enabled_label: str = declare(STR, "amp.txn2.com/enabled", restart=Restart.KUBERNETES, doc=(
        "Label that opts a namespace in. amp reviews a Pod only if its namespace has this label with the value "
        "`enabled_value` (the webhook's `namespaceSelector` should select the same)."))
    enabled_value: str = declare(STR, "true", restart=Restart.KUBERNETES, doc=(
        "The value of `enabled_label` that opts in."))
    endpoint_annotations: tuple[str, ...] = declare(
        STR_LIST, ("amp.txn2.com/ep", "mutation.amp.txn2.com/ep"), restart=Restart.KUBERNETES, doc=(
        "Namespace annotations that name the mutation endpoint URL, in order; the first one that is set and not "
        "empty is used."))
    validation_annotation: str = declare(STR, "validation.amp.txn2.com/ep", restart=Restart.KUBERNETES, doc=(
        "Namespace annotation naming the endpoint for `/validate` (a validating webhook). A namespace with only "
        "this annotation is not a `no-endpoint` failure on `/mutate`."))
    failure_class_label: Optional[str] = declare(OPT_STR, "amp.txn2.com/failure-class", restart=Restart.KUBERNETES,
                                                 doc=(
        "Namespace label, `Fail` or `Ignore`, that chooses the namespace's failure class: what amp does "
        "when a review cannot be completed, and, through the webhook entry of that class (one per class, "
        "selecting on this label), what the API server does when amp cannot be reached "
        "([operations.md](operations.md#choosing-a-failure-class)). It wins over `failure_policy_annotation`. "
        "`null`: no label is read (a registration with a single webhook entry)."))
    failure_policy_annotation: str = declare(STR, "amp.txn2.com/failure-policy", restart=Restart.KUBERNETES, doc=(
        "Namespace annotation, `Ignore` or `Fail`, that overrides `failure_policy` for that namespace when the "
        "namespace has no `failure_class_label`. Deprecated: the API server does not read annotations, "
        "so while amp cannot be reached it does not apply it; a namespace that sets only the annotation, "
        "or one that disagrees with the label, is a namespace problem. Any other value is ignored."))
    mode_annotation: str = declare(STR, "amp.txn2.com/mode", restart=Restart.KUBERNETES, doc=(
        "Namespace annotation; `shadow` calls the endpoint and checks its answer but never applies it "
        "([failure-modes.md](failure-modes.md#shadow-mode))."))
    webhook_configuration: Optional[str] = declare(OPT_STR, None, restart=Restart.KUBERNETES, doc=(
        "Name of amp's own MutatingWebhookConfiguration. When set, amp watches it and `failure_policy: auto` "
        "follows its `failurePolicy`; readiness waits for its first list. When `null`, `auto` means `Fail`."))
    webhook_name: Optional[str] = declare(OPT_STR, None, restart=Restart.KUBERNETES, doc=(
        "Which webhook entry of that configuration `failure_policy: auto` follows: the one that selects namespaces "
        "without a failure-class label (the shipped registration's `ignore.mutate.amp.txn2.com`); `null` reads the "
        "first."))
    watch_timeout: float = declare(POSITIVE_DURATION, 300.0, restart=Restart.KUBERNETES, doc=(
        "Server-side timeout of each watch request; the watch is then resumed from the last resourceVersion. A "
        "watch silent for longer than this plus `request_timeout` is treated as dead and restarted."))
    request_timeout: float = declare(POSITIVE_DURATION, 10.0, restart=Restart.KUBERNETES, doc=(
        "Connect and read timeout of each list and GET (and the connect timeout of watches)."))
    backoff_initial: float = declare(POSITIVE_DURATION, 0.5, restart=Restart.KUBERNETES, doc=(
        "First wait before retrying a failed list or watch; it doubles per consecutive failure, with full jitter."))
    backoff_max: float = declare(POSITIVE_DURATION, 30.0, restart=Restart.KUBERNETES, doc=(
        "The longest wait between retries."))
    miss_timeout: float = declare(POSITIVE_DURATION, 2.0, restart=Restart.KUBERNETES, doc=(
        "Bound on the one GET amp makes for a namespace missing from the cache (created a moment ago), also bounded"
        " by the review's budget. Concurrent reviews for that namespace share the GET."))
    miss_negative_ttl: float = declare(DURATION, 5.0, restart=Restart.KUBERNETES, doc=(
        "How long a namespace the GET found not to exist is remembered as missing; `0` remembers nothing."))
    per_review_get: bool = declare(BOOL, False, restart=Restart.KUBERNETES, doc=(
        "`true`: no namespace watch and no cache; every review does one bounded GET. For clusters with very many "
        "namespaces and few Pods; it puts an API call on every review."))
    own_namespace: Optional[str] = declare(OPT_STR, None, restart=Restart.KUBERNETES, doc=(
        "amp's own namespace. `null`: the namespace of amp's Pod (its service account mount), when amp runs in a "
        "cluster; the chart sets it to the release's namespace. amp never changes Pods there unless "
        "`allow_protected_namespaces` is on, and at start-up it warns when this namespace is enabled (its own Pods "
        "would be sent to it)."))
    protected_namespaces: tuple[str, ...] = declare(STR_LIST, ("kube-system",), restart=Restart.KUBERNETES, doc=(
        "Namespaces whose Pods amp never changes, besides its own: asked anyway (the webhook's `namespaceSelector` "
        "should exclude them), amp answers unchanged without a call, and logs why once per namespace. A webhook "
        "that must answer before its own Pods, or kube-system's, can start can lock a cluster out of recovering."))
    allow_protected_namespaces: bool = declare(BOOL, False, restart=Restart.KUBERNETES, doc=(
        "`true`: amp reviews Pods in its own and the protected namespaces like any other."))
    opt_out_value: str = declare(STR, "false", restart=Restart.KUBERNETES, doc=(
        "A Pod whose `enabled_label` has this value (`amp.txn2.com/enabled: \"false\"`) opts out: amp answers it "
        "unchanged without a call. The shipped webhook's `objectSelector` keeps such Pods from reaching amp at all."))
    bypass: BypassConfig = section(BypassConfig)


@dataclass(frozen=True)
class BreakerConfig:
    consecutive_failures: int = declare(POSITIVE_INT, 5, doc=(
        "The circuit breaker of an origin opens after this many failed calls in a row..."))
    failure_ratio: float = declare(RATIO, 0.5, doc=(
        "... or when this share of the calls in the window failed (a number in (0, 1]),"))
    window: float = declare(POSITIVE_DURATION, 30.0, doc=(
        "the window of that ratio,"))
    min_requests: int = declare(POSITIVE_INT, 20, doc=(
        "with at least this many calls in the window."))
    cooldown: float = declare(POSITIVE_DURATION, 5.0, doc=(
        "How long an open breaker refuses calls (`breaker-open`) before letting a trial call through; it doubles on"
        " each consecutive re-open, plus up to 10% jitter."))
    max_cooldown: float = declare(POSITIVE_DURATION, 120.0, doc=(
        "The longest cool-down; at least `cooldown`."))
    half_open_requests: int = declare(POSITIVE_INT, 1, doc=(
        "Trial calls allowed at once while half-open; a success closes the breaker, a failure re-opens it."))


@dataclass(frozen=True)
class EndpointSettings:
    """Effective settings for calls to one endpoint URL."""

    connect_timeout: float = declare(POSITIVE_DURATION, 1.0, doc=(
        "Bound on the TCP connect to an endpoint."))
    timeout: float = declare(POSITIVE_DURATION, 5.0, doc=(
        "Bound on the whole call (connect, TLS, request, reply), further cut to what is left of the review's "
        "budget. Keep it below the webhook's `timeoutSeconds` minus `deadline.margin`."))
    max_response: int = declare(POSITIVE_SIZE, 1024 * 1024, doc=(
        "Largest reply body; a larger one fails the call with `response-too-large`."))
    max_response_header_size: int = declare(POSITIVE_SIZE, 16 * 1024, doc=(
        "Largest reply head (status line and header lines together, interim `1xx` heads included); a larger one "
        "fails the call with `response-headers-too-large` as soon as it passes the limit, while the headers are "
        "still arriving, and the connection is aborted."))
    max_response_headers: int = declare(POSITIVE_INT, 100, doc=(
        "Most header lines in a reply; one more fails the call with `response-headers-too-large` the same way."))
    pool_size: int = declare(POSITIVE_INT, 32, doc=(
        "Idle keep-alive connections kept per endpoint origin (it bounds idle connections, not concurrent calls)."))
    idle_timeout: float = declare(POSITIVE_DURATION, 60.0, doc=(
        "An idle pooled connection is closed after this long."))
    max_concurrent: int = declare(POSITIVE_INT, 64, doc=(
        "Calls in flight to one origin; the next one waits for a slot in the origin's queue, in arrival order "
        "(`max_queued`, `min_call_time`)."))
    max_queued: int = declare(NONNEG_INT, 1024, doc=(
        "Reviews that may wait for a slot of one origin's `max_concurrent`; one more fails at once with "
        "`queue-full` (`0`: no queue, a call over `max_concurrent` fails at once). See "
        "[operations.md](operations.md#bursts-and-the-bulkhead-queue)."))
    min_call_time: float = declare(DURATION, 0.25, doc=(
        "A review waits in the queue only while its deadline leaves at least this long for the call; then it fails"
        " with `queue-timeout` (a review that arrives with less than this left fails with it at once)."))
    latency_budget: float = declare(DURATION, 0.0, doc=(
        "Latency objective of one origin: when the 90th percentile of its last `latency_window` calls is over "
        "this, new reviews apply the failure policy at once (`latency-budget`) while one probe call at a time "
        "goes out; a probe back within the budget ends it. `0`: off. See "
        "[operations.md](operations.md#latency-budget)."))
    latency_window: int = declare(POSITIVE_INT, 20, doc=(
        "The calls the `latency_budget` objective is taken over (with 20, shedding starts when 3 of the last 20 "
        "took longer than the budget)."))
    retry: bool = declare(BOOL, False, doc=(
        "`true`: retry a call once when the connection could not be made (the endpoint cannot have seen the "
        "request), within the first half of the call's time. Never after a timeout or once anything was sent. "
        "(Whatever this says, a call that meets a kept-alive connection the endpoint closed, before any byte of the"
        " reply, is sent once more on a new connection: [endpoints.md](endpoints.md#connections).)"))
    ca_bundle: Optional[str] = declare(OPT_STR, None, doc=(
        "PEM file of the CA(s) trusted for `https` endpoints; `null` uses the system's trust store."))
    client_cert: Optional[str] = declare(OPT_STR, None, doc=(
        "PEM client certificate (chain) amp presents to `https` endpoints; set together with `client_key`."))
    client_key: Optional[str] = declare(OPT_STR, None, doc=(
        "Its unencrypted PEM key."))
    breaker: BreakerConfig = section(BreakerConfig)
    #: C{endpoints.deny_networks}, the same in the defaults and every
    #: override (an override cannot set it): the networks no address amp
    #: connects to for these settings may be in.
    deny_networks: tuple[Any, ...] = ()
    max_buffered: int = declare(POSITIVE_SIZE, 32 * 1024 * 1024, doc=(
        "Bytes of endpoint replies amp holds at once, over every call to every endpoint: heads while they arrive "
        "and until their reply is over, bodies until their call has ended. A call whose reply would go over it "
        "fails with `reply-buffer-full` (amp's own limit: it does not count against the endpoint's breaker). Not "
        "settable in an override. The sizing arithmetic is in [operations.md](operations.md#sizing)."))


@dataclass(frozen=True)
class EndpointOverride:
    match: URLPattern
    settings: EndpointSettings


@dataclass(frozen=True)
class EndpointsConfig:
    allow: tuple[URLPattern, ...] = declare(URL_PATTERNS, (
        URLPattern.parse("http://*.svc:*/*"),
        URLPattern.parse("https://*.svc:*/*"),
        URLPattern.parse("http://*.svc.cluster.local:*/*"),
        URLPattern.parse("https://*.svc.cluster.local:*/*"),
    ), doc=(
        "URL patterns an endpoint URL must match. A namespace annotation naming any other URL is a `not-allowed` "
        "failure and nothing is called, so whoever can annotate a namespace cannot point amp at arbitrary URLs. "
        "Narrow it to the Services that run your endpoints."))
    deny_networks: tuple[Any, ...] = declare(NETWORKS, (), doc=(
        "Networks amp never connects to, whatever name leads there: CIDRs (`10.0.0.0/8`, `fd00::/8`, a bare "
        "address) and the names `loopback`, `link-local`, `metadata`, `private` and `cgnat` (see "
        "[below](#denying-addresses)). A call whose IP literal, or any address its host name resolves to, is in one"
        " of them fails with `denied-address` without connecting. Not settable in an override. In production use at"
        " least `[link-local, metadata, loopback]`."))
    defaults: EndpointSettings = section(EndpointSettings)
    overrides: tuple[EndpointOverride, ...] = declare(OVERRIDES, (), doc=(
        "Settings for some endpoints: a list of `{match: <URL pattern>, <setting>: <value>, ...}`, e.g. `{match: "
        "\"http://slow.team-b.svc:8080/*\", timeout: 8s, breaker: {cooldown: 30s}}`. The first override whose `match`"
        " matches the endpoint URL applies, on top of the section's settings. One origin has one breaker: its "
        "thresholds come from the override that matches the origin's root URL (`scheme://host:port/`), and a "
        "`breaker` block in an override whose `match` path does not cover `/` is refused at start-up."))
    chain_limit: int = declare(POSITIVE_INT, 4, doc=(
        "The most endpoints one namespace's endpoint annotation may name (an ordered chain, "
        "[endpoints.md](endpoints.md#chains)). A longer chain is the failure `chain-too-long`, found before any "
        "call."))

    def settings_for(self, url: EndpointURL) -> EndpointSettings:
        """
        The first matching override's settings, else the defaults.
        """
        for o in self.overrides:
            if o.match.matches(url):
                return o.settings
        return self.defaults

    def allowed(self, url: EndpointURL) -> bool:
        return any(p.matches(url) for p in self.allow)


@dataclass(frozen=True)
class DeadlineConfig:
    default_timeout: float = declare(POSITIVE_DURATION, 10.0, doc=(
        "The review's total time when the API server's request has no `?timeout=` (it always sends one; keep this "
        "equal to the webhook's `timeoutSeconds`)."))
    margin: float = declare(DURATION, 0.5, doc=(
        "Time kept back from that timeout so amp's answer reaches the API server before it gives up. amp's budget "
        "for a review is the timeout minus the margin, and never less than a tenth of the timeout."))


@dataclass(frozen=True)
class PatchConfig:
    denied_paths: tuple[str, ...] = declare(POINTERS, DEFAULT_DENIED, doc=(
        "JSON pointers a patch may not change: not the path itself, nothing under it, and no ancestor of it "
        "(replacing `/metadata` would rewrite `/metadata/name`). A patch that does is a `refused-path` failure."))
    allowed_paths: tuple[str, ...] = declare(POINTERS, (), doc=(
        "JSON pointers under which changes are allowed even when `denied_paths` would refuse them (e.g. "
        "`/metadata/name` for an endpoint that renames Pods)."))
    repair: bool = declare(BOOL, True, doc=(
        "An `add` whose parent does not exist (`/spec/volumes/-` on a Pod without volumes) gets the operations that"
        " create the missing objects and lists inserted before it. `false`: such a patch is an `apply-failed` "
        "failure."))
    max_size: int = declare(POSITIVE_SIZE, 1024 * 1024, doc=(
        "Largest patch (as JSON, after repair) amp sends to the API server; larger is `patch-too-large`."))
    max_operations: int = declare(POSITIVE_INT, 1000, doc=(
        "Most operations in an endpoint's patch; more is `too-many-operations`."))


@dataclass(frozen=True)
class LogConfig:
    format: str = declare(choice(("text", "json")), "text", doc=(
        "`text`: Twisted's log lines. `json`: one JSON object per line with `time`, `level`, `logger`, `message` "
        "and every field of the event (for a review: `uid`, `namespace`, `pod`, `endpoint`, `result`, `reason`, "
        "`duration_ms`, `patch_size`)."))
    level: str = declare(choice(("debug", "info", "warn", "error")), "info", doc=(
        "`debug`, `info`, `warn` or `error`: lower levels are dropped. Twisted's per-connection \"Starting "
        "factory\"/\"Stopping factory\" lines are written only at `debug`."))


@dataclass(frozen=True)
class RecordConfig:
    """
    Recording reviews for C{amp replay} (L{amp.record}); off by default.
    C{namespaces}: C{["*"]} every namespace, C{["annotated"]} those
    annotated C{amp.txn2.com/record: "true"}, else the names listed.
    """

    enabled: bool = declare(BOOL, False, doc=(
        "Write the reviews of the chosen namespaces to `record.directory`, one JSON line per review."))
    directory: str = declare(STR, "/var/lib/amp/recordings", doc=(
        "Where the files go (`amp-reviews-<time>-<pid>-<n>.jsonl`); created `0700` if missing, made `0700` if it is"
        " amp's own and looser. Replicas and workers may share it (each may then hold one file over the budget "
        "while it writes)."))
    namespaces: tuple[str, ...] = declare(STR_LIST, ("*",), doc=(
        "`[\"*\"]`: every namespace amp reviews; `[\"annotated\"]`: those annotated "
        "`amp.txn2.com/record: \"true\"`; else"
        " the namespaces named."))
    sample: float = declare(RATIO, 1.0, doc=(
        "The share of chosen reviews recorded, in (0, 1]."))
    max_size: int = declare(POSITIVE_SIZE, 256 * 1024 * 1024, doc=(
        "The budget of every recording file in the directory together: at each rotation the oldest files are "
        "removed until the rest fit."))
    file_size: int = declare(POSITIVE_SIZE, 16 * 1024 * 1024, doc=(
        "A file is rotated before it grows past this; at most `record.max_size`. A review larger than this is not "
        "recorded (counted as `failed`)."))
    queue: int = declare(POSITIVE_INT, 1024, doc=(
        "Reviews waiting for the writer process at most (and at most four `record.file_size`s of their bytes); "
        "more are counted as `dropped`, never waited for."))
    redact: bool = declare(BOOL, False, doc=(
        "Replace env var values and annotation values (but amp's own) by stable markers `amp-redacted:<hmac>`: the "
        "same value gives the same marker in the review and in the patch."))


@dataclass(frozen=True)
class AuditConfig:
    """C{amp audit} (L{amp.cli.audit}): its own pace at the endpoints and the API server."""

    concurrency: int = declare(POSITIVE_INT, 4, doc=(
        "`amp audit`: workload templates reviewed at the same time (each one endpoint call per endpoint of its "
        "namespace); `--concurrency` overrides it."))
    rate: int = declare(POSITIVE_INT, 10, doc=(
        "`amp audit`: workload templates reviewed per second at most, so a large cluster's audit is a steady "
        "trickle at the endpoints; `--rate` overrides it."))
    page_size: int = declare(POSITIVE_INT, 500, doc=(
        "`amp audit`: objects per list request to the API server (`limit`); a namespace's Pods are held one page "
        "at a time. `--page-size` overrides it."))
    continuous: bool = declare(BOOL, False, restart=Restart.ALWAYS, doc=(
        "The replica holding the Lease `audit.lease_name` audits every managed namespace (as `amp audit -A` "
        "does) every `audit.interval`, and after a namespace's endpoints change or the config is reloaded (at "
        "most once per `audit.min_interval`), and exposes `amp_audit_pods{namespace,state}`. Needs "
        "`kubernetes.source` cluster or kubeconfig and the chart's `rbac.audit` (list on workloads and Pods)."))
    interval: float = declare(POSITIVE_DURATION, 600.0, doc=(
        "With `audit.continuous`: the time from the end of one audit to the start of the next."))
    min_interval: float = declare(POSITIVE_DURATION, 60.0, doc=(
        "With `audit.continuous`: the least time between the starts of two audits, however often namespaces "
        "change or the config is reloaded."))
    lease_name: str = declare(STR, "amp-audit", restart=Restart.ALWAYS, doc=(
        "With `audit.continuous`: the Lease (in `kubernetes.bypass.lease_namespace`, else amp's own "
        "namespace) whose holder audits; one replica audits at a time."))


@dataclass(frozen=True)
class TracingConfig:
    """
    OpenTelemetry traces of reviews (L{amp.tracing}); off by default.  A
    key left null defers to the standard C{OTEL_*} environment variable.
    """

    enabled: bool = declare(BOOL, False, doc=(
        "Trace reviews with OpenTelemetry: amp continues the API server's W3C trace context (`traceparent`, "
        "`tracestate`), sends it on to every endpoint call, and exports its spans over OTLP. Reloaded without a "
        "restart. `OTEL_SDK_DISABLED=true` keeps it off. See [Tracing](operations.md#tracing)."))
    sampling_ratio: Optional[float] = declare(SHARE, None, doc=(
        "The share of reviews traced, in [0, 1], parent-based: a review whose caller sent a `traceparent` is "
        "traced when the caller's is sampled; the others at this ratio (by trace id, as the SDK's "
        "`parentbased_traceidratio`). `null`: `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` decide, else "
        "every review (`parentbased_always_on`). Reloaded without a restart."))
    protocol: str = declare(choice(("grpc", "http/protobuf")), "grpc", doc=(
        "OTLP over `grpc` or `http/protobuf` (this key decides: the `OTEL_EXPORTER_OTLP_*PROTOCOL` variables are "
        "not read)."))
    endpoint: Optional[str] = declare(OPT_STR, None, doc=(
        "Where spans go: for `grpc` `http://collector:4317` (`https://` for TLS), for `http/protobuf` the full "
        "URL `http://collector:4318/v1/traces`. `null`: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, "
        "`OTEL_EXPORTER_OTLP_ENDPOINT`, else the SDK's default on localhost."))
    headers: Mapping[str, str] = declare(MAPPING, {}, doc=(
        "Headers sent with every export (an API key). Empty: `OTEL_EXPORTER_OTLP_TRACES_HEADERS` or "
        "`OTEL_EXPORTER_OTLP_HEADERS`."))
    service_name: Optional[str] = declare(OPT_STR, None, doc=(
        "The `service.name` of amp's spans. `null`: `OTEL_SERVICE_NAME`, a `service.name` in "
        "`OTEL_RESOURCE_ATTRIBUTES`, else `amp`. `OTEL_RESOURCE_ATTRIBUTES` adds its other attributes."))
    queue: int = declare(POSITIVE_INT, 2048, doc=(
        "Spans waiting for the exporter at most (the exporter runs in a thread of its own). A span that would "
        "wait beyond it, or whose export failed, is dropped and counted (`amp_trace_spans_dropped_total`), never "
        "waited for."))
    batch: int = declare(POSITIVE_INT, 512, doc=(
        "Spans sent in one export at most (at most `tracing.queue`)."))
    interval: float = declare(POSITIVE_DURATION, 1.0, doc=(
        "How long a span waits for its batch to fill before it is exported anyway."))
    export_timeout: float = declare(POSITIVE_DURATION, 10.0, doc=(
        "Bound of one export, its retries included; the spans of an export that fails are dropped."))


@dataclass(frozen=True)
class RegistrationConfig:
    """C{registration}: amp keeping its own MutatingWebhookConfiguration true (opt-in)."""

    managed: bool = declare(BOOL, False, restart=Restart.ALWAYS, doc=(
        "`true` (the overlay `deploy/managed` and the chart's `registration.managed`): the replica holding the "
        "Lease (`kubernetes.bypass.lease_name`) applies the MutatingWebhookConfiguration amp needs "
        "(`kubernetes.webhook_configuration`, one entry per failure class) with server-side apply under the field "
        "manager `amp`, and again whenever it drifts ([operations.md](operations.md#managed-registration)). Needs "
        "`kubernetes.source` cluster or kubeconfig, `kubernetes.webhook_configuration`, amp's own namespace, a "
        "whole-second `deadline.default_timeout` and the RBAC of `deploy/managed`. `false`: amp only checks its "
        "registration. Restart-only."))
    service: str = declare(STR, "amp", restart=Restart.ALWAYS, doc=(
        "The Service (in amp's own namespace) the managed registration sends reviews to."))
    service_port: int = declare(PORT, 443, restart=Restart.ALWAYS, doc=(
        "The port of that Service the managed registration names (its `clientConfig.service.port`)."))
    entry_name: str = declare(STR, "mutate.amp.txn2.com", restart=Restart.ALWAYS, doc=(
        "The managed entries are named `fail.<entry_name>` and `ignore.<entry_name>` (`<entry_name>` alone "
        "without `kubernetes.failure_class_label`); `kubernetes.webhook_name`, when set, names the entry of the "
        "namespaces without the label."))
    default_class: str = declare(choice(("Ignore", "Fail")), "Ignore", restart=Restart.ALWAYS, doc=(
        "With `failure_policy: auto`, the failure class of enabled namespaces without the failure-class label in "
        "the managed registration (otherwise `failure_policy` is)."))
    ca_bundle: str = declare(STR, "/etc/amp/tls/ca.crt", restart=Restart.ALWAYS, doc=(
        "Without `registration.secret`: PEM file of the CA(s) the managed registration's `caBundle` holds (a CA "
        "made elsewhere, e.g. the `ca.crt` of a mounted Secret); read again on every apply, so a CA "
        "that changes is applied."))
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = declare(
        EXPRESSIONS, (), restart=Restart.ALWAYS, doc=(
            "Label selector requirements (`{key, operator, values}`) added to every managed entry's "
            "`namespaceSelector.matchExpressions`, after amp's own (the chart sets them from "
            "`webhook.namespaceSelector.matchExpressions`, as in its static registration)."))
    url: Optional[str] = declare(OPT_STR, None, restart=Restart.ALWAYS, doc=(
        "`https://host:port/mutate`: the managed entries call amp at this URL (`clientConfig.url`: amp outside the "
        "cluster) instead of the Service `registration.service`; with `registration.secret` the serving "
        "certificate names its host as well. `null`: the Service."))
    secret: Optional[str] = declare(OPT_STR, None, restart=Restart.ALWAYS, doc=(
        "With `registration.managed`: the Secret (in amp's own namespace) where amp keeps its own CA and serving "
        "certificate ([operations.md](operations.md#managed-certificates)): the Lease holder creates it when "
        "missing, renews the serving certificate at two thirds of its life and rotates the CA with an overlap "
        "(old and new CA both in the `caBundle` until every replica serves a certificate of the new one); every "
        "replica serves the certificate the Secret holds, read every `tls.reload_interval`, and `tls.cert`, "
        "`tls.key` and `registration.ca_bundle` are not read. `null`: amp serves `tls.cert` and the caBundle is "
        "`registration.ca_bundle` (cert-manager, or certificates made elsewhere). Restart-only."))
    ca_validity: float = declare(POSITIVE_DURATION, 365 * 24 * 3600.0, restart=Restart.ALWAYS, doc=(
        "With `registration.secret`: the life of amp's own CA; a new CA is made at two thirds of it (or when the "
        "Secret is annotated `amp.txn2.com/rotate-ca`). At least twice `registration.cert_validity`."))
    cert_validity: float = declare(POSITIVE_DURATION, 90 * 24 * 3600.0, restart=Restart.ALWAYS, doc=(
        "With `registration.secret`: the life of the serving certificate amp issues itself (never beyond its CA's);"
        " it is renewed at two thirds of it. At least 30s (short lives are for tests)."))
    repair_interval: float = declare(POSITIVE_DURATION, 10.0, restart=Restart.ALWAYS, doc=(
        "Least time between two applies: drift is repaired at most this often (a controller fighting amp over "
        "the object costs one apply per interval). Failed applies are retried with `kubernetes.backoff_initial` "
        "doubling up to `kubernetes.backoff_max`."))


@dataclass(frozen=True)
class Config:
    listen: ListenConfig = section(ListenConfig)
    tls: TLSConfig = section(TLSConfig)
    metrics: MetricsConfig = section(MetricsConfig)
    kubernetes: KubernetesConfig = section(KubernetesConfig)
    endpoints: EndpointsConfig = section(EndpointsConfig)
    failure_policy: FailurePolicy = declare(choice(FailurePolicy), FailurePolicy.AUTO, doc=(
        "What amp does when a review cannot be completed ([failure-modes.md](failure-modes.md)): `Ignore` admits "
        "the Pod unchanged with a warning; `Fail` denies it. `auto` follows the `failurePolicy` of amp's own "
        "MutatingWebhookConfiguration (`kubernetes.webhook_configuration`), and is `Fail` while that is unknown. A "
        "namespace's failure-class label `amp.txn2.com/failure-class` (or, deprecated, its "
        "`amp.txn2.com/failure-policy` annotation) overrides it."))
    annotate_status: bool = declare(BOOL, True, doc=(
        "amp stamps every Pod it reviews on `/mutate` in an enabled namespace (not in shadow mode) with the "
        "annotation `amp.txn2.com/status`: `mutated <endpoint>`, `unchanged <endpoint>` or `skipped <reason> "
        "<endpoint>`, per endpoint across the rounds of one admission "
        "([endpoints.md](endpoints.md#the-status-stamp)), in the same patch, and removes the `amp.txn2.com/skipped`"
        " annotation of earlier versions. `false`: amp adds, changes and removes no annotation. The old name "
        "`annotate_skipped` is still read as this key."))
    ephemeral_containers: bool = declare(BOOL, False, doc=(
        "`true`: amp also reviews `pods/ephemeralcontainers` updates (`kubectl debug`) in enabled namespaces; the "
        "webhook configuration needs the matching rule too (the chart's `webhook.ephemeralContainers`). The "
        "endpoint gets the Pod with `X-Amp-Operation: UPDATE` and `X-Amp-Subresource: ephemeralcontainers`, and amp"
        " refuses any operation outside `/spec/ephemeralContainers` (and amp's own status annotation). `false`: "
        "such reviews are answered unchanged."))
    deadline: DeadlineConfig = section(DeadlineConfig)
    patch: PatchConfig = section(PatchConfig)
    log: LogConfig = section(LogConfig)
    record: RecordConfig = section(RecordConfig)
    audit: AuditConfig = section(AuditConfig)
    tracing: TracingConfig = section(TracingConfig)
    registration: RegistrationConfig = section(RegistrationConfig)
    workers: int = declare(POSITIVE_INT, 1, restart=Restart.ALWAYS, doc=(
        "Number of amp processes per replica, all serving the webhook port (one listening socket, bound by worker "
        "0; each new connection goes to the worker with the fewest open). `1`: one process, as before. Above `1`: "
        "the process twistd starts is worker 0 and runs the others as child processes, restarting one that exits; "
        "`listen.port` must then be fixed (not `0`) and worker `i` serves metrics on `metrics.port + i`. Metrics, "
        "readiness and the namespace watch are per process. See [Workers](operations.md#workers)."))
    reload_interval: float = declare(POSITIVE_DURATION, 5.0, doc=(
        "How often amp checks its config file for a change (see [Reloading without a "
        "restart](#reloading-without-a-restart)). `SIGHUP` reloads at once."))


#: Every key of the configuration, in declaration order: its path, kind,
#: default, documentation and restart rule (the endpoint settings sit
#: directly under C{endpoints}: they are its defaults).
KEYS: tuple[Key, ...] = tuple(declared_keys(Config, flatten=lambda name: name == "defaults"))
