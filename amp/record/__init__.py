"""
Recording reviews, and replaying them: the tools for changing an endpoint
safely.

 - L{Recorder}: with the config's C{record} section on, writes chosen
   reviews (the request as the API server sent it, the namespace as amp saw
   it, the route and amp's answer) as JSON lines under a directory, within a
   byte budget, by a writer process of its own: never a blocking write on
   the reactor, never a delayed answer.
 - L{replay}: C{amp replay}, each recorded review through amp's own review
   core again, compared with the recording or with a candidate endpoint.
 - L{pod_differences}: two admitted Pods compared by JSON path (replay and
   the canary).
"""

from amp.record._compare import MISSING, Difference, pod_differences
from amp.record._entry import Capture, RecordedReview, RecordingError, decode_line, encode_line
from amp.record._files import RecordFiles, recording_files
from amp.record._recorder import RECORD_ANNOTATION, RECORD_RESULTS, Recorder
from amp.record._redact import MARKER_PREFIX, KeptAnnotations, Redactor

__all__ = [
    "Capture", "Difference", "KeptAnnotations", "MARKER_PREFIX", "MISSING", "RECORD_ANNOTATION", "RECORD_RESULTS",
    "RecordFiles", "RecordedReview", "Recorder", "RecordingError", "Redactor", "decode_line",
    "encode_line", "pod_differences", "recording_files",
]
