"""Tests for the fake API server, driven by the real ``kubernetes`` client over loopback.

Every blocking call is bounded: watches pass ``timeout_seconds`` (server side)
and ``_request_timeout`` (client side), waits on the server use a timeout, and
threads are joined with a timeout, so a bug fails a test instead of hanging it.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from typing import Any, Iterator

import kubernetes.client
import pytest
import urllib3
from kubernetes import watch
from kubernetes.client.exceptions import ApiException

from tests.fakekube import FakeKube, Request, api_client, client_configuration

T = 5  # seconds: the bound on every blocking call


@pytest.fixture
def kube() -> Iterator[FakeKube]:
    server = FakeKube().start()
    try:
        yield server
    finally:
        server.stop()
        assert server.thread is not None and not server.thread.is_alive()
        assert server.errors == []


@pytest.fixture
def client(kube: FakeKube) -> Iterator[kubernetes.client.ApiClient]:
    with api_client(kube) as c:
        yield c


@pytest.fixture
def core(client: kubernetes.client.ApiClient) -> kubernetes.client.CoreV1Api:
    return kubernetes.client.CoreV1Api(client)


@pytest.fixture
def adm(client: kubernetes.client.ApiClient) -> kubernetes.client.AdmissionregistrationV1Api:
    return kubernetes.client.AdmissionregistrationV1Api(client)


def stream(w: watch.Watch, func: Any, **kwargs: Any) -> Iterator[dict[str, Any]]:
    kwargs.setdefault("timeout_seconds", T)
    kwargs.setdefault("_request_timeout", T)
    return w.stream(func, **kwargs)


def summary(event: dict[str, Any]) -> tuple[str, str, str]:
    meta = event["raw_object"]["metadata"]
    return event["type"], meta.get("name", ""), meta["resourceVersion"]


# list and get


def test_list_returns_items_labels_and_resource_version(kube: FakeKube, core: Any) -> None:
    kube.add_namespace("team-a", labels={"amp.txn2.com/enabled": "true"},
                       annotations={"amp.txn2.com/ep": "http://ep.example/mutate"})
    kube.add_namespace("team-b")

    listed = core.list_namespace(_request_timeout=T)

    assert [ns.metadata.name for ns in listed.items] == ["team-a", "team-b"]
    first = listed.items[0]
    assert first.metadata.labels == {"amp.txn2.com/enabled": "true",
                                     "kubernetes.io/metadata.name": "team-a"}
    assert first.metadata.annotations == {"amp.txn2.com/ep": "http://ep.example/mutate"}
    assert first.status.phase == "Active"
    assert listed.metadata.resource_version == kube.resource_version
    assert int(first.metadata.resource_version) < int(listed.items[1].metadata.resource_version)


def test_list_wire_format_matches_api_server(kube: FakeKube) -> None:
    kube.add_namespace("team-a")
    connection = http.client.HTTPConnection("127.0.0.1", kube.port, timeout=T)
    try:
        connection.request("GET", "/api/v1/namespaces")
        response = connection.getresponse()
        body = json.loads(response.read())
    finally:
        connection.close()

    assert response.status == 200
    assert response.getheader("Content-Type") == "application/json"
    assert body["kind"] == "NamespaceList"
    assert body["apiVersion"] == "v1"
    assert body["metadata"] == {"resourceVersion": kube.resource_version}
    assert "kind" not in body["items"][0]
    assert body["items"][0]["metadata"]["name"] == "team-a"


def test_list_with_label_and_field_selectors(kube: FakeKube, core: Any) -> None:
    kube.add_namespace("on", labels={"amp.txn2.com/enabled": "true"})
    kube.add_namespace("off", labels={"amp.txn2.com/enabled": "false"})
    kube.add_namespace("bare")

    def names(**kwargs: Any) -> list[str]:
        return [ns.metadata.name for ns in core.list_namespace(_request_timeout=T, **kwargs).items]

    assert names(label_selector="amp.txn2.com/enabled=true") == ["on"]
    assert names(label_selector="amp.txn2.com/enabled!=true") == ["bare", "off"]
    assert names(label_selector="amp.txn2.com/enabled") == ["off", "on"]
    assert names(label_selector="!amp.txn2.com/enabled") == ["bare"]
    assert names(label_selector="amp.txn2.com/enabled in (true, false)") == ["off", "on"]
    assert names(field_selector="metadata.name=bare") == ["bare"]
    with pytest.raises(ApiException) as raised:
        names(field_selector="spec.nothing=1")
    assert raised.value.status == 400


def test_list_from_a_future_resource_version_is_a_timeout_status(kube: FakeKube, core: Any) -> None:
    with pytest.raises(ApiException) as raised:
        core.list_namespace(resource_version=str(int(kube.resource_version) + 10),
                            _request_timeout=T)
    assert raised.value.status == 504
    assert "Too large resource version" in json.loads(raised.value.body)["message"]


def test_get_existing_namespace(kube: FakeKube, core: Any) -> None:
    kube.add_namespace("team-a", annotations={"amp.txn2.com/failure-policy": "Fail"})

    ns = core.read_namespace("team-a", _request_timeout=T)

    assert ns.kind == "Namespace"
    assert ns.metadata.annotations == {"amp.txn2.com/failure-policy": "Fail"}
    assert ns.metadata.resource_version == kube.resource_version


def test_get_missing_namespace_is_a_404_status(kube: FakeKube, core: Any) -> None:
    with pytest.raises(ApiException) as raised:
        core.read_namespace("nope", _request_timeout=T)

    assert raised.value.status == 404
    status = json.loads(raised.value.body)
    assert status["kind"] == "Status"
    assert status["status"] == "Failure"
    assert status["reason"] == "NotFound"
    assert status["code"] == 404
    assert status["message"] == 'namespaces "nope" not found'


def test_keep_alive_connection_serves_many_requests(kube: FakeKube) -> None:
    kube.add_namespace("team-a")
    connection = http.client.HTTPConnection("127.0.0.1", kube.port, timeout=T)
    try:
        statuses = []
        for path in ("/api/v1/namespaces/team-a", "/api/v1/namespaces/nope", "/version"):
            connection.request("GET", path)
            response = connection.getresponse()
            assert int(response.getheader("Content-Length")) == len(response.read())
            statuses.append(response.status)
        local_port = connection.sock.getsockname()[1]
        connection.request("GET", "/api")
        connection.getresponse().read()
        assert connection.sock.getsockname()[1] == local_port
    finally:
        connection.close()
    assert statuses == [200, 404, 200]


def test_unknown_path_and_write_methods_are_refused(kube: FakeKube) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", kube.port, timeout=T)
    try:
        connection.request("GET", "/api/v1/pods")
        response = connection.getresponse()
        assert response.status == 404
        assert json.loads(response.read())["reason"] == "NotFound"
        connection.request("POST", "/api/v1/namespaces", body=b'{"metadata":{"name":"x"}}',
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 405
        assert json.loads(response.read())["reason"] == "MethodNotAllowed"
    finally:
        connection.close()
    assert kube.get_namespace("x") is None


def test_discovery_endpoints(kube: FakeKube, client: Any) -> None:
    version = kubernetes.client.VersionApi(client).get_code(_request_timeout=T)
    assert (version.major, version.minor) == ("1", "30")
    api = kubernetes.client.CoreApi(client).get_api_versions(_request_timeout=T)
    assert api.versions == ["v1"]
    groups = kubernetes.client.ApisApi(client).get_api_versions(_request_timeout=T)
    assert [g.name for g in groups.groups] == ["admissionregistration.k8s.io"]


# watch


def test_watch_from_list_resource_version_sees_changes_in_order(kube: FakeKube, core: Any) -> None:
    kube.add_namespace("before")
    rv = core.list_namespace(_request_timeout=T).metadata.resource_version
    kube.add_namespace("team-a")
    kube.put_webhook_configuration("amp", [{"name": "amp.txn2.com"}])  # another kind: not seen
    kube.update_namespace("team-a", labels={"amp.txn2.com/enabled": "true"})
    kube.delete_namespace("team-a")

    events = stream(watch.Watch(), core.list_namespace, resource_version=rv,
                    allow_watch_bookmarks=True)
    seen = [next(events) for _ in range(3)]
    events.close()

    assert [summary(e) for e in seen] == [
        ("ADDED", "team-a", str(int(rv) + 1)),
        ("MODIFIED", "team-a", str(int(rv) + 3)),
        ("DELETED", "team-a", str(int(rv) + 4)),
    ]
    assert isinstance(seen[1]["object"], kubernetes.client.V1Namespace)
    assert seen[1]["object"].metadata.labels["amp.txn2.com/enabled"] == "true"


def test_watch_delivers_events_that_happen_while_it_is_open(kube: FakeKube, core: Any) -> None:
    rv = kube.resource_version
    events = stream(watch.Watch(), core.list_namespace, resource_version=rv)
    opened = threading.Thread(target=lambda: (kube.wait_for_watches(1, timeout=T),
                                              kube.add_namespace("late")))
    opened.start()
    try:
        first = next(events)
    finally:
        events.close()
        opened.join(T)
    assert summary(first) == ("ADDED", "late", str(int(rv) + 1))


def test_each_event_is_one_chunk_and_timeout_ends_the_stream_cleanly(kube: FakeKube) -> None:
    rv = kube.resource_version
    kube.add_namespace("a")
    kube.add_namespace("b")
    sock = socket.create_connection(("127.0.0.1", kube.port), timeout=T)
    try:
        sock.sendall(f"GET /api/v1/namespaces?watch=1&resourceVersion={rv}&timeoutSeconds=1 "
                     "HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        raw = b""
        while not raw.endswith(b"\r\n0\r\n\r\n"):
            data = sock.recv(65536)
            assert data, f"stream closed without terminating chunk: {raw!r}"
            raw += data
    finally:
        sock.close()

    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in head
    chunks = []
    while True:
        size_line, _, body = body.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            break
        chunks.append(body[:size])
        assert body[size:size + 2] == b"\r\n"
        body = body[size + 2:]
    assert [json.loads(c)["object"]["metadata"]["name"] for c in chunks] == ["a", "b"]
    assert all(c.endswith(b"\n") and c.count(b"\n") == 1 for c in chunks)


def test_watch_timeout_ends_client_stream_without_error(kube: FakeKube, core: Any) -> None:
    events = stream(watch.Watch(), core.list_namespace,
                    resource_version=kube.resource_version, timeout_seconds=1)
    assert list(events) == []
    # The server finishes its side of the stream a moment after the client
    # has read the last chunk.
    assert kube.wait_for_no_watches(timeout=5)


def test_watch_without_resource_version_starts_with_current_state(
        kube: FakeKube, core: Any) -> None:
    kube.add_namespace("b")
    kube.add_namespace("a")
    events = stream(watch.Watch(), core.list_namespace)
    first, second = next(events), next(events)
    events.close()
    assert [summary(first)[:2], summary(second)[:2]] == [("ADDED", "a"), ("ADDED", "b")]


def test_bookmark_reaches_watches_that_allow_them(kube: FakeKube, core: Any) -> None:
    kube.add_namespace("a")
    rv = kube.resource_version
    w = watch.Watch()
    events = stream(w, core.list_namespace, resource_version=rv, allow_watch_bookmarks=True)
    plain = stream(watch.Watch(), core.list_namespace, resource_version=rv)
    # the client sends the request lazily, at the first next(): read both in threads
    results: dict[str, Any] = {}
    reader = threading.Thread(target=lambda: results.update(plain=next(plain)))
    bookmarked = threading.Thread(target=lambda: results.update(
        bookmark=next(events), rv_after_bookmark=w.resource_version))
    reader.start()
    bookmarked.start()
    try:
        assert kube.wait_for_watches(2, timeout=T)
        kube.bookmark()
        bookmarked.join(T)
        kube.add_namespace("b")
        added = next(events)
        reader.join(T)
    finally:
        events.close()
        plain.close()

    bookmark = results["bookmark"]
    assert bookmark["type"] == "BOOKMARK"
    assert bookmark["raw_object"] == {"kind": "Namespace", "apiVersion": "v1",
                                      "metadata": {"resourceVersion": rv}}
    assert results["rv_after_bookmark"] == rv
    assert summary(added)[:2] == ("ADDED", "b")
    assert w.resource_version == added["object"].metadata.resource_version
    # the watch without allowWatchBookmarks saw no bookmark: its first event is the ADDED
    assert summary(results["plain"])[:2] == ("ADDED", "b")


def test_label_selector_watch_turns_label_changes_into_added_and_deleted(
        kube: FakeKube, core: Any) -> None:
    rv = kube.resource_version
    kube.add_namespace("team-a")
    kube.update_namespace("team-a", labels={"amp.txn2.com/enabled": "true"})
    kube.update_namespace("team-a", labels={"amp.txn2.com/enabled": "true"},
                          annotations={"amp.txn2.com/ep": "http://ep/"})
    kube.update_namespace("team-a", labels={})
    kube.add_namespace("team-b", labels={"amp.txn2.com/enabled": "true"})

    events = stream(watch.Watch(), core.list_namespace, resource_version=rv,
                    label_selector="amp.txn2.com/enabled=true")
    seen = [summary(next(events))[:2] for _ in range(4)]
    events.close()

    assert seen == [("ADDED", "team-a"), ("MODIFIED", "team-a"),
                    ("DELETED", "team-a"), ("ADDED", "team-b")]


def test_expired_resource_version_raises_api_exception_410(kube: FakeKube, core: Any) -> None:
    old = kube.resource_version
    kube.add_namespace("a")
    kube.expire_history()

    events = stream(watch.Watch(), core.list_namespace, resource_version=old)
    with pytest.raises(ApiException) as raised:
        next(events)

    assert raised.value.status == 410
    assert raised.value.reason.startswith("Expired: too old resource version")
    assert kube.count("/api/v1/namespaces", watch=True) == 1


def test_expired_without_timeout_seconds_is_retried_once_by_the_client(
        kube: FakeKube, core: Any) -> None:
    old = kube.resource_version
    kube.add_namespace("a")
    kube.expire_history()

    events = watch.Watch().stream(core.list_namespace, resource_version=old,
                                  _request_timeout=T)
    with pytest.raises(ApiException) as raised:
        next(events)

    assert raised.value.status == 410
    assert [r.query["resourceVersion"] for r in kube.requests] == [old, old]


def test_watch_from_current_version_after_expiry_works(kube: FakeKube, core: Any) -> None:
    kube.add_namespace("a")
    kube.expire_history()
    rv = core.list_namespace(_request_timeout=T).metadata.resource_version
    kube.add_namespace("b")
    events = stream(watch.Watch(), core.list_namespace, resource_version=rv)
    first = next(events)
    events.close()
    assert summary(first)[:2] == ("ADDED", "b")


def test_expired_as_http_410() -> None:
    with FakeKube(expired_as="http") as kube, api_client(kube) as c:
        old = kube.resource_version
        kube.add_namespace("a")
        kube.expire_history()
        events = stream(watch.Watch(), kubernetes.client.CoreV1Api(c).list_namespace,
                        resource_version=old)
        with pytest.raises(ApiException) as raised:
            next(events)
        assert raised.value.status == 410
        assert json.loads(raised.value.body)["reason"] == "Expired"
        assert kube.errors == []


def test_history_limit_expires_old_resource_versions() -> None:
    with FakeKube(history_limit=2) as kube, api_client(kube) as c:
        core = kubernetes.client.CoreV1Api(c)
        start = kube.resource_version
        kube.add_namespace("a")
        after_a = kube.resource_version
        kube.add_namespace("b")
        kube.add_namespace("c")

        with pytest.raises(ApiException) as raised:
            next(stream(watch.Watch(), core.list_namespace, resource_version=start))
        assert raised.value.status == 410

        events = stream(watch.Watch(), core.list_namespace, resource_version=after_a)
        assert [summary(next(events))[1] for _ in range(2)] == ["b", "c"]
        events.close()
        assert kube.errors == []


def test_drop_watches_cuts_the_stream(kube: FakeKube, core: Any) -> None:
    rv = kube.resource_version
    kube.add_namespace("a")
    events = stream(watch.Watch(), core.list_namespace, resource_version=rv)
    assert summary(next(events))[1] == "a"
    assert kube.open_watches() == 1

    assert kube.drop_watches() == 1

    with pytest.raises(urllib3.exceptions.ProtocolError):
        next(events)
    assert kube.wait_for_no_watches(timeout=T)
    # the server keeps serving after a drop
    assert core.read_namespace("a", _request_timeout=T).metadata.name == "a"


def test_watch_closed_by_the_client_is_no_longer_open(kube: FakeKube, core: Any) -> None:
    rv = kube.resource_version
    kube.add_namespace("a")
    events = stream(watch.Watch(), core.list_namespace, resource_version=rv, timeout_seconds=60)
    next(events)
    assert kube.open_watches() == 1
    events.close()
    started = time.monotonic()
    assert kube.wait_for_no_watches(timeout=T)
    assert time.monotonic() - started < 1


def test_open_watch_that_falls_behind_history_gets_410(kube: FakeKube, core: Any) -> None:
    rv = kube.resource_version
    kube.add_namespace("a")
    events = stream(watch.Watch(), core.list_namespace, resource_version=rv)
    assert summary(next(events))[1] == "a"
    # a change and an expiry that the open watch has not caught up with
    with kube._cond:
        kube._state.rv += 1
        kube._state.floor = kube._state.rv
        kube._cond.notify_all()
    with pytest.raises(ApiException) as raised:
        next(events)
    assert raised.value.status == 410


# webhook configurations


def test_webhook_configuration_list_get_and_defaults(kube: FakeKube, adm: Any) -> None:
    kube.put_webhook_configuration("amp", [{"name": "amp.txn2.com", "failurePolicy": "Ignore"},
                                           {"name": "other.txn2.com"}])

    listed = adm.list_mutating_webhook_configuration(_request_timeout=T)
    got = adm.read_mutating_webhook_configuration("amp", _request_timeout=T)

    assert [c.metadata.name for c in listed.items] == ["amp"]
    assert listed.metadata.resource_version == kube.resource_version
    assert [(h.name, h.failure_policy) for h in got.webhooks] == [
        ("amp.txn2.com", "Ignore"), ("other.txn2.com", "Fail")]
    assert got.webhooks[0].timeout_seconds == 10
    assert adm.list_mutating_webhook_configuration(
        field_selector="metadata.name=other", _request_timeout=T).items == []


def test_missing_webhook_configuration_is_404(kube: FakeKube, adm: Any) -> None:
    with pytest.raises(ApiException) as raised:
        adm.read_mutating_webhook_configuration("amp", _request_timeout=T)
    assert raised.value.status == 404
    status = json.loads(raised.value.body)
    assert status["details"] == {"name": "amp", "kind": "mutatingwebhookconfigurations",
                                 "group": "admissionregistration.k8s.io"}


def test_webhook_configuration_watch(kube: FakeKube, adm: Any) -> None:
    rv = kube.resource_version
    kube.put_webhook_configuration("amp", [{"name": "amp.txn2.com", "failurePolicy": "Fail"}])
    kube.add_namespace("ignored")
    kube.put_webhook_configuration("amp", [{"name": "amp.txn2.com", "failurePolicy": "Ignore"}])
    kube.delete_webhook_configuration("amp")

    events = stream(watch.Watch(), adm.list_mutating_webhook_configuration,
                    resource_version=rv, allow_watch_bookmarks=True,
                    field_selector="metadata.name=amp")
    seen = [next(events) for _ in range(3)]
    events.close()

    assert [summary(e)[:2] for e in seen] == [("ADDED", "amp"), ("MODIFIED", "amp"),
                                              ("DELETED", "amp")]
    assert isinstance(seen[1]["object"], kubernetes.client.V1MutatingWebhookConfiguration)
    assert seen[1]["object"].webhooks[0].failure_policy == "Ignore"
    assert seen[1]["object"].metadata.generation == 2


# control API


def test_change_methods_bump_one_global_resource_version(kube: FakeKube) -> None:
    start = int(kube.resource_version)
    a = kube.add_namespace("a")
    w = kube.put_webhook_configuration("amp")
    m = kube.update_namespace("a", annotations={"k": "v"})
    t = kube.terminate_namespace("a")
    d = kube.delete_namespace("a")
    versions = [int(o["metadata"]["resourceVersion"]) for o in (a, w, m, t, d)]
    assert versions == list(range(start + 1, start + 6))
    assert t["status"]["phase"] == "Terminating" and "deletionTimestamp" in t["metadata"]
    assert kube.get_namespace("a") is None
    kube.add_namespace("b")
    with pytest.raises(ValueError):
        kube.add_namespace("b")
    with pytest.raises(KeyError):
        kube.update_namespace("missing", labels={})
    with pytest.raises(KeyError):
        kube.delete_webhook_configuration("missing")


def test_concurrent_changes_get_unique_versions(kube: FakeKube) -> None:
    results: list[str] = []
    lock = threading.Lock()

    def add(prefix: str) -> None:
        for i in range(50):
            rv = kube.add_namespace(f"{prefix}-{i}")["metadata"]["resourceVersion"]
            with lock:
                results.append(rv)

    threads = [threading.Thread(target=add, args=(p,)) for p in "abcd"]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(T)
    assert len(set(results)) == 200
    assert kube.resource_version == str(max(int(r) for r in results))


def test_fail_next_answers_errors_then_recovers(kube: FakeKube, core: Any) -> None:
    kube.add_namespace("a")
    kube.fail_next(2, status=503)
    for _ in range(2):
        with pytest.raises(ApiException) as raised:
            core.read_namespace("a", _request_timeout=T)
        assert raised.value.status == 503
        assert json.loads(raised.value.body)["reason"] == "ServiceUnavailable"
    assert core.read_namespace("a", _request_timeout=T).metadata.name == "a"


def test_fail_next_applies_to_watches_and_to_a_path_prefix(kube: FakeKube, core: Any) -> None:
    kube.fail_next(1, status=500, path_prefix="/api/v1/namespaces")
    assert kubernetes.client.VersionApi(core.api_client).get_code(_request_timeout=T).major == "1"
    with pytest.raises(ApiException) as raised:
        next(stream(watch.Watch(), core.list_namespace, resource_version=kube.resource_version))
    assert raised.value.status == 500


def test_set_delay_delays_answers_and_the_client_retries_read_timeouts(
        kube: FakeKube, core: Any) -> None:
    kube.add_namespace("a")
    kube.set_delay(T * 2)
    # urllib3's default Retry(3) re-sends a GET after a read timeout: 4 tries in all
    with pytest.raises(urllib3.exceptions.MaxRetryError) as raised:
        core.read_namespace("a", _request_timeout=(T, 0.2))
    assert isinstance(raised.value.reason, urllib3.exceptions.ReadTimeoutError)
    assert kube.count("/api/v1/namespaces/a") == 4
    kube.set_delay(0)
    assert core.read_namespace("a", _request_timeout=T).metadata.name == "a"


def test_set_delay_with_path_prefix_spares_other_paths(kube: FakeKube, core: Any) -> None:
    kube.set_delay(T * 2, path_prefix="/apis/")
    assert [n.metadata.name for n in core.list_namespace(_request_timeout=T).items] == []


def test_request_log_and_counts(kube: FakeKube, core: Any) -> None:
    kube.add_namespace("a")
    core.list_namespace(_request_timeout=T)
    core.read_namespace("a", _request_timeout=T)
    events = stream(watch.Watch(), core.list_namespace)
    next(events)
    events.close()

    assert kube.requests[1] == Request("GET", "/api/v1/namespaces/a", {})
    method, path, query = kube.requests[2]
    assert (method, path, query["watch"]) == ("GET", "/api/v1/namespaces", "true")
    assert kube.count("/api/v1/namespaces") == 3
    assert kube.count("/api/v1/namespaces", watch=True) == 1
    assert kube.count("/api/v1/namespaces", watch=False) == 2
    assert kube.count("/apis/") == 0
    assert kube.served == 3


def test_request_log_limit_keeps_the_last_entries() -> None:
    with FakeKube(request_log_limit=2) as kube, api_client(kube) as c:
        core = kubernetes.client.CoreV1Api(c)
        kube.add_namespace("a")
        for name in ("x", "y", "a"):
            try:
                core.read_namespace(name, _request_timeout=T)
            except ApiException:
                pass
        assert [r.path for r in kube.requests] == ["/api/v1/namespaces/y", "/api/v1/namespaces/a"]
        assert kube.served == 3


def test_client_configuration_points_at_the_server(kube: FakeKube) -> None:
    configuration = client_configuration(kube, token="abc")
    assert configuration.host == kube.url
    assert kube.url == f"http://127.0.0.1:{kube.port}"
    assert configuration.auth_settings()["BearerToken"]["value"] == "Bearer abc"


# stop


def test_stop_returns_promptly_with_an_open_watch() -> None:
    kube = FakeKube().start()
    outcome: dict[str, Any] = {}

    def consume() -> None:
        with api_client(kube) as c:
            events = watch.Watch().stream(kubernetes.client.CoreV1Api(c).list_namespace,
                                          resource_version=kube.resource_version,
                                          timeout_seconds=60, _request_timeout=T * 2)
            try:
                outcome["events"] = list(events)
            except Exception as error:
                outcome["error"] = error

    consumer = threading.Thread(target=consume)
    consumer.start()
    assert kube.wait_for_watches(1, timeout=T)

    started = time.monotonic()
    kube.stop()
    elapsed = time.monotonic() - started
    consumer.join(T)

    assert elapsed < 2
    assert kube.thread is not None and not kube.thread.is_alive()
    assert not consumer.is_alive()
    assert isinstance(outcome.get("error"), urllib3.exceptions.ProtocolError)
    assert kube.errors == []


def test_stop_interrupts_a_delayed_answer() -> None:
    kube = FakeKube().start()
    kube.set_delay(60)
    outcome: dict[str, Any] = {}

    def get() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", kube.port, timeout=T * 2)
        try:
            connection.request("GET", "/version")
            outcome["status"] = connection.getresponse().status
        except Exception as error:
            outcome["error"] = error
        finally:
            connection.close()

    getter = threading.Thread(target=get)
    getter.start()
    assert kube.wait_for_requests(1, "/version", timeout=T)

    started = time.monotonic()
    kube.stop()
    elapsed = time.monotonic() - started
    getter.join(T)

    assert elapsed < 2
    assert not getter.is_alive()
    assert "status" not in outcome
    assert isinstance(outcome["error"], (http.client.RemoteDisconnected, ConnectionError))


def test_stop_closes_idle_keep_alive_connections() -> None:
    kube = FakeKube().start()
    connection = http.client.HTTPConnection("127.0.0.1", kube.port, timeout=T)
    try:
        connection.request("GET", "/version")
        connection.getresponse().read()
        started = time.monotonic()
        kube.stop()
        assert time.monotonic() - started < 2
        assert connection.sock.recv(1) == b""
    finally:
        connection.close()
    assert not kube.thread.is_alive()
