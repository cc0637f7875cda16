"""
The list/watch loop (thread side: runs in a thread of its own, never on the
reactor).

L{ListWatch} lists one collection, then watches it from the list's
resourceVersion, forever: it resumes from the last resourceVersion it saw
(an event's or a bookmark's) when a watch ends, relists when the server
says that version is too old (410 Gone, as an HTTP answer or as an ERROR
event), restarts a stream that stays silent past its read timeout, backs
off with full jitter after errors, and returns promptly once its stop flag
is set.  Everything it learns leaves through C{emit} as one of the typed
events of L{amp.kube._events}; C{emit} is the bridge to the reactor.

It talks to the API through a L{amp.kube._client.Lister}; tests give it a
scripted one, a C{random}, a C{monotonic} and a C{wait} of their own, and
run it synchronously.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional

from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import MaxRetryError, ProtocolError, ReadTimeoutError

from amp.config import KubernetesConfig
from amp.kube._client import Lister, describe
from amp.kube._events import Bookmark, Changed, Crashed, Replaced, Restarting, WatchEvent

ALL_KINDS = frozenset({"ADDED", "MODIFIED", "DELETED"})


def backoff_delay(attempt: int, initial: float, cap: float, random: Callable[[], float]) -> float:
    """
    Seconds to wait before retry number C{attempt} (0 for the first): "full
    jitter", uniform in M{[0, min(cap, initial * 2 ** attempt))}, so that
    many amp replicas do not reconnect in step after an API server restart.
    """
    ceiling = min(cap, initial * 2.0 ** min(max(attempt, 0), 64))
    return random() * ceiling


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone): relist."""


class _WatchError(Exception):
    """An ERROR event other than 410."""


def _reason(error: BaseException, streaming: bool) -> str:
    if isinstance(error, MaxRetryError) and error.reason is not None:
        error = error.reason
    if isinstance(error, (ReadTimeoutError, socket.timeout)):
        return "stalled"
    if streaming and isinstance(error, (ProtocolError, OSError)):
        return "dropped"
    return "error"


class ListWatch:
    """
    List, then watch from the list's resourceVersion, forever, for one
    collection (see the module docstring).

    @param lister: the collection.
    @param parse: makes the kept value of one object, in this thread; None
        drops the object (it is neither listed nor reported).
    @param collect: makes L{Replaced.items} of a list's parsed objects.
    @param kinds: the event types reported as L{Changed}; the others still
        move the resourceVersion on.
    @param page_size: list in pages of this many objects (C{limit} and
        C{continue}); None lists in one request.
    @param emit: where the events go (the bridge to the reactor).
    @param stop: set to end the loop.
    @param wait: waits between attempts; returns early when stopped
        (C{stop.wait} unless given).
    """

    def __init__(
        self,
        *,
        lister: Lister,
        parse: Callable[[Mapping[str, Any]], Any],
        emit: Callable[[WatchEvent], None],
        stop: threading.Event,
        config: KubernetesConfig,
        random: Callable[[], float],
        collect: Callable[[list[Any]], Any] = tuple,
        kinds: Iterable[str] = ALL_KINDS,
        page_size: Optional[int] = None,
        monotonic: Callable[[], float] = time.monotonic,
        wait: Optional[Callable[[float], Any]] = None,
    ) -> None:
        self._lister = lister
        self._parse = parse
        self._collect = collect
        self._kinds = frozenset(kinds)
        self._page_size = page_size
        self.emit = emit
        self._stop = stop
        self._config = config
        self._random = random
        self._monotonic = monotonic
        self._wait = wait if wait is not None else stop.wait
        self.resource_version: Optional[str] = None
        connect = config.request_timeout
        self._list_timeout = (connect, config.request_timeout)
        self._server_timeout = max(1, int(round(config.watch_timeout)))
        # Longer than the server's own timeout: a stream that stays silent
        # past it (no event, no bookmark, no end) is dead and is restarted.
        self._watch_timeout = (connect, self._server_timeout + config.request_timeout)
        self._progress = False
        self._streaming = False

    @property
    def stopping(self) -> threading.Event:
        """The loop's stop flag."""
        return self._stop

    def run(self) -> None:
        """The loop; returns when stopped."""
        failures = 0
        while not self._stop.is_set():
            self._progress = False
            self._streaming = False
            error = ""
            try:
                if self.resource_version is None:
                    self._list()
                    if self._stop.is_set():
                        break
                started = self._monotonic()
                events = self._watch()
                reason = "timeout"
                if events == 0 and self._monotonic() - started < self._server_timeout / 2:
                    error = "the watch ended early without events"
                else:
                    self._progress = True
            except _Expired as e:
                self.resource_version = None
                reason, error = "expired", str(e)
            except ApiException as e:
                if self._stop.is_set():
                    break
                if e.status == 410:
                    self.resource_version = None
                    reason, error = "expired", describe(e)
                else:
                    reason, error = "error", describe(e)
            except Exception as e:
                if self._stop.is_set():
                    break
                reason, error = _reason(e, self._streaming), describe(e)
            if self._stop.is_set():
                break
            if self._progress:
                failures = 0
            if self._progress and reason == "timeout" and not error:
                delay = 0.0
            elif reason == "expired" and failures == 0:
                delay = 0.0
                failures += 1
            else:
                delay = backoff_delay(failures, self._config.backoff_initial, self._config.backoff_max, self._random)
                failures += 1
            self.emit(Restarting(reason, error, delay))
            if delay > 0:
                self._wait(delay)

    def run_guarded(self) -> None:
        """L{run}, reporting a bug as L{Crashed} rather than dying silently."""
        try:
            self.run()
        except BaseException as e:
            self.emit(Crashed(describe(e)))

    def _list(self) -> None:
        items: list[Any] = []
        token: Optional[str] = None
        while True:
            body = self._lister.list(limit=self._page_size, continue_token=token, timeout=self._list_timeout)
            doc = json.loads(body)
            parse = self._parse
            for obj in doc.get("items") or ():
                kept = parse(obj)
                if kept is not None:
                    items.append(kept)
            meta = doc.get("metadata") or {}
            rv = str(meta.get("resourceVersion", ""))
            token = meta.get("continue") if self._page_size else None
            if not token:
                break
            if self._stop.is_set():
                return
        self.emit(Replaced(self._collect(items), rv))
        self.resource_version = rv

    def _watch(self) -> int:
        """
        One watch request; returns the number of events when the server
        ends the stream, raises otherwise.
        """
        assert self.resource_version is not None
        stream = self._lister.watch(
            resource_version=self.resource_version, timeout_seconds=self._server_timeout, timeout=self._watch_timeout
        )
        self._streaming = True
        events = 0
        try:
            for line in stream:
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind = event.get("type")
                obj = event.get("object") or {}
                rv = str((obj.get("metadata") or {}).get("resourceVersion", ""))
                if kind in ALL_KINDS:
                    if kind in self._kinds:
                        kept = self._parse(obj)
                        if kept is not None:
                            self.emit(Changed(kind, kept, rv))
                elif kind == "BOOKMARK":
                    self.emit(Bookmark(rv))
                elif kind == "ERROR":
                    code, message = obj.get("code"), obj.get("message", "")
                    if code == 410:
                        raise _Expired(f"{obj.get('reason', 'Expired')}: {message}")
                    raise _WatchError(f"ERROR event {code} {obj.get('reason', '')}: {message}")
                else:
                    continue
                events += 1
                self._progress = True
                if rv:
                    self.resource_version = rv
        finally:
            stream.close()
        return events
