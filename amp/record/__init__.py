"""
Recording reviews: the first of the tools for changing an endpoint safely
(C{amp replay}, L{amp.cli.replay}, runs the recordings again; the canary,
L{amp.canary}, compares a candidate on live traffic).

 - L{Recorder}: with the config's C{record} section on, writes chosen
   reviews (the request as the API server sent it, the namespace as amp saw
   it, the route and amp's answer) as JSON lines under a directory, within a
   byte budget, by a writer process of its own: never a blocking write on
   the reactor, never a delayed answer.
 - L{RecordedReview}, L{decode_line}: a recording's lines read back.

The names below are imported when first used (a module C{__getattr__}):
the writer process (C{python -m amp.record._writer}) imports this package
first, and importing the recorder's side with it (Twisted, prometheus_client)
made the writer a 40 MiB process where its own modules need about 20.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from amp.record._entry import Capture, RecordedReview, RecordingError, decode_line, encode_line
    from amp.record._files import RecordFiles, recording_files
    from amp.record._recorder import RECORD_ANNOTATION, RECORD_RESULTS, Recorder
    from amp.record._redact import MARKER_PREFIX, KeptAnnotations, Redactor

__all__ = [
    "Capture",
    "KeptAnnotations",
    "MARKER_PREFIX",
    "RECORD_ANNOTATION",
    "RECORD_RESULTS",
    "RecordFiles",
    "RecordedReview",
    "Recorder",
    "RecordingError",
    "Redactor",
    "decode_line",
    "encode_line",
    "recording_files",
]


def __getattr__(name: str) -> Any:
    module: Any
    if name in ("Capture", "RecordedReview", "RecordingError", "decode_line", "encode_line"):
        from amp.record import _entry as module
    elif name in ("RecordFiles", "recording_files"):
        from amp.record import _files as module
    elif name in ("RECORD_ANNOTATION", "RECORD_RESULTS", "Recorder"):
        from amp.record import _recorder as module
    elif name in ("MARKER_PREFIX", "KeptAnnotations", "Redactor"):
        from amp.record import _redact as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value
