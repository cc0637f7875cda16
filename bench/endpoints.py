#!/usr/bin/env python3
"""
Measurements of amp's endpoint client over loopback; prints figures.

  1. Hung endpoint: how long a review (L{amp.admission.Admitter}) takes to
     answer when its endpoint accepts the connection and never replies.  It
     should be the review's budget, not more.
  2. Breaker open: amp's own time per review, and per endpoint call, while
     the endpoint's circuit breaker is open (no network call).  It should be
     well under a millisecond.
  3. Healthy endpoint: calls per second, amp's CPU time per call (the
     figure that survives a busy machine: wall-clock rates swing with other
     load) and latency through the pool at a given concurrency, steady and
     in waves, and connections opened; waves again with a pool of 2 idle
     connections per origin (Twisted's default) to show what an undersized
     pool costs; full reviews per second through the Admitter.
  4. The client alone, in memory: CPU per call with one pooled connection
     on a memory reactor and no sockets, the steadiest figure for comparing
     request paths (C{--only-memory} runs just this).
  5. Hostile endpoints (L{bench.hostile_endpoints}): C{max_concurrent}
     calls at once on each of several origins, every reply hostile: amp's
     peak RSS and its reply budget's peak, per kind (C{--only-hostile} runs
     just this).

The healthy endpoint runs in a child process (a minimal keep-alive HTTP/1.1
responder, C{--serve}) so that the figures are amp's, not a server sharing
its event loop.  Everything listens on 127.0.0.1; every loop is bounded.

Run: C{python bench/endpoints.py [--calls N] [--concurrency C] [--budget S]}.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

if __package__:
    from bench.hostile_endpoints import hostile
else:  # run as a script (python bench/endpoints.py): bench/ is the first path entry
    from hostile_endpoints import hostile  # type: ignore[no-redef]


_REPLY_BODY = b'[{"op":"add","path":"/metadata/labels/bench","value":"true"}]'
_REPLY = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
    len(_REPLY_BODY),
    _REPLY_BODY,
)


# ---------------------------------------------------------------- the child endpoint


def serve() -> None:
    """
    Answer every request with a fixed patch until SIGTERM; print the port
    first and the number of accepted connections last, as JSON lines.
    """
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory, Protocol

    accepted = [0]

    class Fixed(Protocol):
        def connectionMade(self) -> None:
            accepted[0] += 1
            self._buffer = b""
            self._skip = 0

        def dataReceived(self, data: bytes) -> None:
            buffer = self._buffer + data
            replies = []
            while True:
                if self._skip:
                    if len(buffer) < self._skip:
                        self._skip -= len(buffer)
                        buffer = b""
                        break
                    buffer = buffer[self._skip :]
                    self._skip = 0
                    replies.append(_REPLY)
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    break
                head, buffer = buffer[:end].lower(), buffer[end + 4 :]
                at = head.find(b"content-length:")
                length = int(head[at + 15 :].split(b"\r\n", 1)[0]) if at >= 0 else 0
                if length:
                    self._skip = length
                else:
                    replies.append(_REPLY)
            self._buffer = buffer
            if replies:
                self.transport.write(b"".join(replies))

    port = reactor.listenTCP(0, Factory.forProtocol(Fixed), interface="127.0.0.1", backlog=512)
    signal.signal(signal.SIGTERM, lambda *a: reactor.callFromThread(reactor.stop))
    print(json.dumps({"port": port.getHost().port}), flush=True)
    reactor.run()
    print(json.dumps({"accepted": accepted[0]}), flush=True)


class ChildEndpoint:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--serve"], stdout=subprocess.PIPE, text=True
        )
        atexit.register(self._kill)
        assert self.process.stdout is not None
        self.port = json.loads(self.process.stdout.readline())["port"]

    def _kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        out, _ = self.process.communicate(timeout=10)
        return json.loads(out.strip().splitlines()[-1])["accepted"]


# ---------------------------------------------------------------- amp under test


def review_body(i: int = 0) -> bytes:
    return json.dumps(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": f"bench-{i}",
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": "bench",
                "name": "web",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "web", "labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "c", "image": "nginx"}]},
                },
            },
        }
    ).encode()


def build(url: str, *, endpoints: dict[str, Any], failure_policy: str = "Ignore") -> tuple[Any, Any, Any]:
    """
    An Admitter for namespace C{bench} pointing at C{url}; returns
    (admitter, client, config).
    """
    from twisted.internet import reactor

    from amp.admission import Admitter
    from amp.breaker import BreakerRegistry
    from amp.config import parse_config
    from amp.endpoint import EndpointClient
    from amp.metrics import Metrics
    from amp.namespaces import StaticNamespaceSource

    config = parse_config(
        {
            "failure_policy": failure_policy,
            "kubernetes": {
                "source": "static",
                "namespaces": {
                    "bench": {"labels": {"amp.txn2.com/enabled": "true"}, "annotations": {"amp.txn2.com/ep": url}}
                },
            },
            "endpoints": dict({"allow": ["http://127.0.0.1:*/*"]}, **endpoints),
        }
    )
    metrics = Metrics()
    client = EndpointClient(reactor, metrics, BreakerRegistry(reactor))
    admitter = Admitter(config, StaticNamespaceSource(config.kubernetes), client, reactor, metrics)
    return admitter, client, config


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p))]


# ---------------------------------------------------------------- scenarios


def hung(budget: float, rounds: int, burst: int) -> Any:
    from twisted.internet import reactor
    from twisted.internet.defer import gatherResults, inlineCallbacks
    from twisted.internet.protocol import Factory, Protocol

    from amp.admission_review import parse_review
    from amp.deadline import Deadline

    @inlineCallbacks
    def run() -> Any:
        port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
        url = f"http://127.0.0.1:{port.getHost().port}/hang"
        admitter, client, _ = build(url, endpoints={"timeout": "30s", "max_concurrent": burst + 1})
        request = parse_review(review_body())
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            _, outcome = yield admitter.review(request, Deadline.after(reactor.seconds(), budget))
            times.append(time.perf_counter() - started)
        assert outcome.reason == "timeout", outcome

        def timed_review() -> Any:
            started = time.perf_counter()
            return admitter.review(request, Deadline.after(reactor.seconds(), budget)).addCallback(
                lambda answer: (answer[1].reason, time.perf_counter() - started)
            )

        answers = yield gatherResults([timed_review() for _ in range(burst)])
        assert all(reason == "timeout" for reason, _ in answers)
        burst_times = [t for _, t in answers]
        yield client.close()
        yield port.stopListening()
        print(f"1. hung endpoint, budget {ms(budget)} (endpoint timeout 30 s), {rounds} reviews one after another:")
        print(
            f"   answer time min {ms(min(times))}  median {ms(statistics.median(times))}  max {ms(max(times))}"
            f"  (worst overshoot {ms(max(times) - budget)})"
        )
        print(
            f"   {burst} reviews at once: answer time min {ms(min(burst_times))}"
            f"  median {ms(statistics.median(burst_times))}  max {ms(max(burst_times))}"
        )

    return run()


def breaker_open(reviews: int) -> Any:
    from twisted.internet import reactor
    from twisted.internet.defer import inlineCallbacks
    from twisted.internet.protocol import Factory, Protocol

    from amp.admission_review import parse_review
    from amp.deadline import Deadline
    from amp.endpoint import EndpointRequest, deferred_call
    from amp.urls import parse_endpoint_url

    @inlineCallbacks
    def run() -> Any:
        port = reactor.listenTCP(0, Factory.forProtocol(Protocol), interface="127.0.0.1")
        number = port.getHost().port
        yield port.stopListening()
        url = f"http://127.0.0.1:{number}/mutate"
        admitter, client, config = build(
            url, endpoints={"breaker": {"consecutive_failures": 1, "cooldown": "10m", "max_cooldown": "10m"}}
        )
        request = parse_review(review_body())
        _, outcome = yield admitter.review(request, Deadline.after(reactor.seconds(), 5.0))
        assert outcome.reason == "connection-refused", outcome
        _, outcome = yield admitter.review(request, Deadline.after(reactor.seconds(), 5.0))
        assert outcome.reason == "breaker-open", outcome

        def timed(fn: Callable[[], Any]) -> float:
            best = float("inf")
            for _ in range(5):
                started = time.perf_counter()
                for _ in range(reviews):
                    fn()
                best = min(best, (time.perf_counter() - started) / reviews)
            return best

        review_time = timed(lambda: admitter.review(request, Deadline.after(reactor.seconds(), 5.0)))
        target = parse_endpoint_url(url)
        settings = config.endpoints.settings_for(target)
        body = b'{"kind":"Pod"}'

        def call() -> None:
            deferred_call(
                client, EndpointRequest(target, settings, body, {}, Deadline.after(reactor.seconds(), 10.0))
            ).addErrback(lambda f: None)

        call_time = timed(call)
        yield client.close()
        print(f"2. breaker open, best of 5 x {reviews}:")
        print(f"   whole review (route, refuse, failure policy, encode answer): {review_time * 1e6:.1f} us")
        print(f"   endpoint call alone (breaker check, metric, failure): {call_time * 1e6:.1f} us")

    return run()


def healthy(calls: int, concurrency: int) -> Any:
    from twisted.internet import reactor
    from twisted.internet.defer import gatherResults, inlineCallbacks

    from amp.admission_review import parse_review
    from amp.deadline import Deadline
    from amp.endpoint import EndpointRequest, deferred_call
    from amp.urls import parse_endpoint_url

    @inlineCallbacks
    def through_client(pool_size: int, waves: bool) -> Any:
        """
        C{calls} calls: either C{concurrency} workers calling one after
        another (steady), or waves of C{concurrency} calls at once, each
        wave waiting for the last (bursty: the pool is drained to
        C{pool_size} idle connections between waves).
        """
        child = ChildEndpoint()
        url = f"http://127.0.0.1:{child.port}/mutate"
        _, client, config = build(url, endpoints={"pool_size": pool_size, "max_concurrent": concurrency})
        target = parse_endpoint_url(url)
        settings = config.endpoints.settings_for(target)
        body = review_body()
        headers = {
            b"x-amp-namespace": b"bench",
            b"x-amp-operation": b"CREATE",
            b"x-amp-uid": b"bench",
            b"x-amp-dry-run": b"false",
        }
        latencies: list[float] = []

        def one() -> Any:
            started = time.perf_counter()
            return deferred_call(
                client, EndpointRequest(target, settings, body, headers, Deadline.after(reactor.seconds(), 10.0))
            ).addCallback(lambda _: latencies.append(time.perf_counter() - started))

        left = [calls]

        @inlineCallbacks
        def worker() -> Any:
            while left[0] > 0:
                left[0] -= 1
                yield one()

        started = time.perf_counter()
        cpu = time.process_time()
        if waves:
            for _ in range(calls // concurrency):
                yield gatherResults([one() for _ in range(concurrency)])
        else:
            yield gatherResults([worker() for _ in range(concurrency)])
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        opened = client.connections_opened
        yield client.close()
        accepted = yield deferToProcess(child.stop)
        kind = "waves " if waves else "steady"
        print(
            f"   {kind} pool_size {pool_size:>3}: {len(latencies) / elapsed:6.0f} calls/s"
            f"  amp CPU {cpu / len(latencies) * 1e6:5.0f} us/call"
            f"  p50 {ms(percentile(latencies, 0.5))}  p99 {ms(percentile(latencies, 0.99))}"
            f"  connections opened {opened} (endpoint accepted {accepted})"
        )

    @inlineCallbacks
    def through_admitter() -> Any:
        child = ChildEndpoint()
        url = f"http://127.0.0.1:{child.port}/mutate"
        admitter, client, _ = build(url, endpoints={"pool_size": concurrency, "max_concurrent": concurrency})
        request = parse_review(review_body())
        left = [calls]
        results = []

        @inlineCallbacks
        def worker() -> Any:
            while left[0] > 0:
                left[0] -= 1
                _, outcome = yield admitter.review(request, Deadline.after(reactor.seconds(), 5.0))
                results.append(outcome.result)

        started = time.perf_counter()
        cpu = time.process_time()
        yield gatherResults([worker() for _ in range(concurrency)])
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
        yield client.close()
        accepted = yield deferToProcess(child.stop)
        patched = results.count("patched")
        print(
            f"   whole reviews through the Admitter: {calls / elapsed:8.0f} reviews/s"
            f"  amp CPU {cpu / calls * 1e6:5.0f} us/review"
            f"  ({patched}/{len(results)} patched, endpoint accepted {accepted} connections)"
        )

    @inlineCallbacks
    def run() -> Any:
        print(f"3. healthy endpoint in a child process, {calls} calls, concurrency {concurrency}:")
        yield through_client(concurrency, waves=False)
        yield through_client(concurrency, waves=True)
        yield through_client(2, waves=True)
        yield through_admitter()

    return run()


def in_memory(calls: int) -> None:
    """
    The client's own CPU per call with no sockets and no other process: one
    pooled connection on a memory reactor, each call's reply written into
    amp's HTTP client as soon as its request is out.  Best of 5 runs of
    C{calls} calls; the figure to compare request paths with.
    """
    from twisted.internet.address import IPv4Address
    from twisted.internet.testing import MemoryReactorClock, StringTransport

    from amp.breaker import BreakerRegistry
    from amp.config import parse_config
    from amp.deadline import Deadline
    from amp.endpoint import EndpointClient, EndpointRequest, deferred_call
    from amp.metrics import Metrics
    from amp.urls import parse_endpoint_url

    config = parse_config({"endpoints": {"allow": ["http://127.0.0.1:*/*"]}})
    memory = MemoryReactorClock()
    settings = config.endpoints.defaults
    client = EndpointClient(memory, Metrics(), BreakerRegistry(memory))
    target = parse_endpoint_url("http://127.0.0.1:8090/mutate")
    body = review_body()
    headers = {
        b"x-amp-namespace": b"bench",
        b"x-amp-operation": b"CREATE",
        b"x-amp-uid": b"bench",
        b"x-amp-dry-run": b"false",
    }
    deadline = Deadline.after(memory.seconds(), 10.0)
    first = deferred_call(client, EndpointRequest(target, settings, body, headers, deadline))
    host, port, factory = memory.tcpClients[0][:3]
    proto = factory.buildProtocol(IPv4Address("TCP", host, port))
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(_REPLY)
    failures: list[Any] = []
    first.addErrback(failures.append)

    def run() -> float:
        started = time.process_time()
        for _ in range(calls):
            d = deferred_call(client, EndpointRequest(target, settings, body, headers, deadline))
            transport.clear()
            proto.dataReceived(_REPLY)
            d.addErrback(failures.append)
        return (time.process_time() - started) / calls

    best = min(run() for _ in range(5))
    assert not failures and len(memory.tcpClients) == 1, (failures, memory.tcpClients)
    print(f"4. the client alone, in memory (one pooled connection, no sockets), best of 5 x {calls} calls:")
    print(f"   amp CPU {best * 1e6:.1f} us/call")


# ---------------------------------------------------------------- hostile endpoints


#: What the hostile child endpoint sends, by path: a kind of reply amp must
#: not let grow its memory.
def deferToProcess(stop: Callable[[], int]) -> Any:
    from twisted.internet import reactor
    from twisted.internet.threads import deferToThreadPool

    return deferToThreadPool(reactor, reactor.getThreadPool(), stop)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=5000, help="calls per healthy-endpoint run")
    parser.add_argument("--concurrency", type=int, default=32, help="calls in flight in the healthy runs")
    parser.add_argument("--budget", type=float, default=0.25, help="review budget for the hung endpoint, seconds")
    parser.add_argument("--rounds", type=int, default=20, help="sequential reviews against the hung endpoint")
    parser.add_argument("--reviews", type=int, default=20000, help="reviews timed with the breaker open")
    parser.add_argument("--memory-calls", type=int, default=5000, help="calls per in-memory run")
    parser.add_argument("--only-memory", action="store_true", help="run only the in-memory measurement")
    parser.add_argument("--hostile-origins", type=int, default=4, help="origins in the hostile run")
    parser.add_argument("--hostile-calls", type=int, default=64, help="calls at once per origin in the hostile run")
    parser.add_argument("--only-hostile", action="store_true", help="run only the hostile-endpoint measurement")
    args = parser.parse_args(argv)
    if args.serve:
        serve()
        return 0
    if args.only_memory:
        in_memory(args.memory_calls)
        return 0

    from twisted.internet import reactor
    from twisted.internet.defer import inlineCallbacks

    status = [0]

    @inlineCallbacks
    def everything() -> Any:
        try:
            if args.only_hostile:
                yield hostile(args.hostile_origins, args.hostile_calls, review_body())
                return
            yield hung(args.budget, args.rounds, 50)
            yield breaker_open(args.reviews)
            yield healthy(args.calls, args.concurrency)
            in_memory(args.memory_calls)
            yield hostile(args.hostile_origins, args.hostile_calls, review_body())
        except Exception:
            import traceback

            traceback.print_exc()
            status[0] = 1
        finally:
            reactor.stop()

    reactor.callWhenRunning(everything)
    reactor.run()
    return status[0]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
