"""
What C{amp audit} reads from the cluster, page by page (the blocking calls
in the reactor's thread pool, the pages handed back to the reactor).

Read-only: only GETs (list).  Every list is paged (C{limit} and
C{continue}), so a namespace with thousands of Pods is held one page at a
time; each page's JSON is parsed in the thread that read it.  An API
error names the list that failed.

L{PagedLists} takes the GET as a callable: the tests give it an API in
memory, the command the cluster's (L{kube_getter}).
"""

from __future__ import annotations

import json
import urllib.parse
from typing import TYPE_CHECKING, Any, Callable, Optional

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.threads import deferToThreadPool

from amp.podjson import json_object

if TYPE_CHECKING:
    from amp.kube import KubeClient
    from amp.reactors import IAmpReactor

__all__ = ["ClusterError", "PagedLists", "Page", "kube_getter"]

#: One page: its items and the token of the next (None: the last).
Page = tuple[list[dict[str, Any]], Optional[str]]

#: The lists the audit reads, by what it calls them: (API path prefix, resource).
RESOURCES = {
    "Pod": ("/api/v1", "pods"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "StatefulSet": ("/apis/apps/v1", "statefulsets"),
    "DaemonSet": ("/apis/apps/v1", "daemonsets"),
    "ReplicaSet": ("/apis/apps/v1", "replicasets"),
    "Job": ("/apis/batch/v1", "jobs"),
    "CronJob": ("/apis/batch/v1", "cronjobs"),
}


class ClusterError(Exception):
    """A list could not be read; the message names it and why."""


def _path(kind: str, namespace: Optional[str]) -> str:
    if kind == "Namespace":
        return "/api/v1/namespaces"
    prefix, resource = RESOURCES[kind]
    ns = urllib.parse.quote(namespace or "", safe="")
    return f"{prefix}/namespaces/{ns}/{resource}" if namespace else f"{prefix}/{resource}"


#: GET (path, query) -> the body; blocking.
Getter = Callable[[str, list[tuple[str, str]]], bytes]


def kube_getter(client: KubeClient, timeout: float) -> Getter:
    """A L{Getter} on an L{amp.kube.KubeClient} (each GET bounded by C{timeout})."""

    def get(path: str, query: list[tuple[str, str]]) -> bytes:
        return bytes(client.request("GET", path, query=query, timeout=timeout))

    return get


class PagedLists:
    """
    Lists by pages of C{page_size} through C{get}, each GET in
    C{reactor}'s thread pool (or, with no reactor, at once: the tests).
    """

    def __init__(self, get: Getter, page_size: int, reactor: Optional[IAmpReactor] = None) -> None:
        self._get = get
        self._page_size = page_size
        self._reactor = reactor

    def _fetch(self, kind: str, namespace: Optional[str], selector: str, token: Optional[str]) -> Page:
        query = [("limit", str(self._page_size))]
        if selector:
            query.append(("labelSelector", selector))
        if token:
            query.append(("continue", token))
        where = f"{kind} list" + (f" in namespace {namespace}" if namespace else "")
        try:
            body = json.loads(self._get(_path(kind, namespace), query))
        except Exception as e:
            raise ClusterError(f"{where}: {_describe(e)}") from None
        if not isinstance(body, dict) or not isinstance(body.get("items") or [], list):
            raise ClusterError(f"{where}: the answer is not a list")
        items = [dict(i, kind=kind) for i in body.get("items") or [] if isinstance(i, dict)]
        meta = json_object(body.get("metadata"))
        return items, (str(meta["continue"]) if meta.get("continue") else None)

    def page(self, kind: str, namespace: Optional[str], selector: str, token: Optional[str]) -> Deferred[Page]:
        """One page; fires with a L{Page}."""
        if self._reactor is None:
            try:
                d: Deferred[Page] = Deferred()
                d.callback(self._fetch(kind, namespace, selector, token))
                return d
            except ClusterError:
                from twisted.internet.defer import fail

                return fail()
        return deferToThreadPool(
            self._reactor, self._reactor.getThreadPool(), self._fetch, kind, namespace, selector, token
        )

    @inlineCallbacks
    def each_page(
        self, kind: str, namespace: Optional[str], on_page: Callable[[list[dict[str, Any]]], Any], selector: str = ""
    ) -> Any:
        """
        Call C{on_page} with each page's items in turn (waiting for the
        Deferred it may return before reading the next page).
        """
        token: Optional[str] = None
        while True:
            items, token = yield self.page(kind, namespace, selector, token)
            yield on_page(items)
            if not token:
                return

    @inlineCallbacks
    def all_items(self, kind: str, namespace: Optional[str], selector: str = "") -> Any:
        """Every item of a (small) list: namespaces, workloads."""
        out: list[dict[str, Any]] = []
        yield self.each_page(kind, namespace, out.extend, selector)
        return out


def _describe(error: BaseException) -> str:
    status = getattr(error, "status", None)
    if isinstance(status, int):
        reason = getattr(error, "reason", "") or ""
        return f"HTTP {status} {reason}".strip()
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]
