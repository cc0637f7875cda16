"""
The one reader of the files amp parses; every byte of them is untrusted.

Whoever can edit amp's ConfigMap or its Secrets, or hands a file to C{amp
explain}, decides what these files hold, so each is read the same bounded
way before anything looks at what it says:

  - a byte cap, checked while reading (at most one byte more than the cap
    is ever read): L{CONFIG_LIMIT} for amp's config (what a ConfigMap can
    hold), L{PEM_LIMIT} for certificates and keys (what a Secret can hold),
    L{INPUT_LIMIT} for C{amp explain}'s files and the kubeconfig;
  - an empty file, and bytes that are not UTF-8, refused;
  - JSON nested at most L{MAX_DEPTH} deep, measured before parsing and
    without recursion by the review's own check
    (L{amp.admission_review.nesting_exceeds}), then decoded as reviews are
    (L{amp.admission_review.decode_bounded}: no C{NaN} or C{Infinity}, integers in
    64 bits, finite floats);
  - YAML limited to what JSON can say (mappings, sequences, strings,
    numbers, booleans, null; an unquoted date stays a string; any other tag
    is refused), numbers as for JSON, and its shape bounded from the
    parser's events before a single object is built: at most L{MAX_DEPTH}
    levels of nesting, and aliases held to arithmetic.  amp's own config
    may not use anchors or aliases at all (it never needs them, and a
    ConfigMap is exactly the input an attacker with one edit controls); a
    Pod or workload file may, as long as the file with every alias
    expanded has at most L{MAX_NODES} nodes and is still at most
    L{MAX_DEPTH} deep.  A few hundred bytes of nested aliases that would
    expand to billions of nodes are refused by counting, never expanded.

Every refusal is a L{FileError} whose message is one line that names the
file, the line where it is known, what is wrong and the limit.

What identifies one version of a file amp reloads when it changes (the
serving certificate's files, the config file) lives here too
(L{FileState}, L{observe}): where its path resolves to, its inode, size and
modification time.  Comparing the resolved path sees the atomic C{..data}
symlink swap the kubelet does for a ConfigMap or Secret volume; inode, size
and mtime see a rewrite in place.  A rewrite with the same size within the
file system's timestamp granularity of the previous one is not seen:
C{SIGHUP} re-reads regardless.

Reading is blocking I/O: the daemon calls these functions before the
reactor runs or from a thread (L{amp.reload}), never on the reactor thread
for a file that can change under it.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import IO, Any, Optional, Union

import yaml
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)

from amp.admission_review import MAX_DEPTH, decode_bounded, nesting_exceeds
from amp.text import lone_surrogate, may_hold_surrogate

__all__ = [
    "CONFIG_LIMIT",
    "FileError",
    "FileState",
    "INPUT_LIMIT",
    "MAX_DEPTH",
    "MAX_NODES",
    "Observed",
    "PEM_LIMIT",
    "config_document",
    "observe",
    "parse_documents",
    "parse_json",
    "read_file",
    "read_stream",
    "text_of",
]

_MIB = 1024 * 1024

#: amp's config file: a ConfigMap holds at most 1 MiB.
CONFIG_LIMIT = 1 * _MIB
#: A certificate, key or CA bundle: a Secret holds at most 1 MiB.
PEM_LIMIT = 1 * _MIB
#: A file handed to C{amp explain} (a Pod, a workload, a C{kubectl get -o
#: yaml} list, a recorded reply) and the kubeconfig.
INPUT_LIMIT = 16 * _MIB
#: Nodes a YAML file may have with every alias expanded (a Pod has a few
#: hundred).
MAX_NODES = 1_000_000

#: The integers a file may hold: 64 bits, signed or not (as in reviews).
_INT_RANGE = (-(2**63), 2**64 - 1)
#: Longer than any 64-bit integer YAML can write (0b and 64 digits, with
#: a sign and some underscores): refused before it is converted.
_INT_TEXT_MAX = 80


class FileError(ValueError):
    """
    A file amp will not use; the message is one line naming the file, the
    line where known, the problem and the limit.
    """


def _size(limit: int) -> str:
    if limit % _MIB == 0:
        return f"{limit // _MIB} MiB"
    return f"{limit} bytes"


# ---------------------------------------------------------------- versions


@dataclass(frozen=True)
class FileState:
    """One version of a file."""

    realpath: str
    inode: int
    size: int
    mtime_ns: int

    @classmethod
    def of_open_file(cls, path: str, fd: int) -> "FileState":
        """The state of exactly the file open as C{fd} (opened from C{path})."""
        st = os.fstat(fd)
        return cls(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)


#: A file's state, or the error that stopped us from looking at it.
Observed = Union[FileState, str]


def observe(path: str) -> Observed:
    """The state of the file at C{path} now, or the error seeing it."""
    try:
        st = os.stat(path)
    except OSError as e:
        return f"error {e.errno}"
    return FileState(os.path.realpath(path), st.st_ino, st.st_size, st.st_mtime_ns)


# ---------------------------------------------------------------- bytes


def read_file(path: str, label: str, limit: int) -> tuple[bytes, FileState]:
    """
    The bytes of the file at C{path} (C{label}, say C{"config file
    etc/amp.yaml"}, names it in errors), at most C{limit} of them, with the
    state of exactly the file that was read.

    @raise FileError: it cannot be read, is empty or is larger than C{limit}.
    """
    try:
        with open(path, "rb") as f:
            state = FileState.of_open_file(path, f.fileno())
            data = f.read(limit + 1)
    except FileNotFoundError:
        raise FileError(f"{label}: file not found") from None
    except PermissionError:
        raise FileError(f"{label}: not readable (permission denied)") from None
    except IsADirectoryError:
        raise FileError(f"{label}: is a directory, expected a file") from None
    except OSError as e:
        raise FileError(f"{label}: cannot be read ({e.strerror})") from None
    return _checked_size(data, label, limit), state


def read_stream(stream: IO[Any], label: str, limit: int) -> bytes:
    """
    At most C{limit} bytes from C{stream} (standard input: its binary
    buffer when it has one), as L{read_file} reads a file.

    @raise FileError: empty or larger than C{limit}.
    """
    stream = getattr(stream, "buffer", stream)
    data = stream.read(limit + 1)
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    return _checked_size(data, label, limit)


def _checked_size(data: bytes, label: str, limit: int) -> bytes:
    if len(data) > limit:
        raise FileError(f"{label} is larger than {_size(limit)}, the limit for this file")
    if not data.strip():
        raise FileError(f"{label} is empty")
    return data


def text_of(data: bytes, label: str) -> str:
    """
    C{data} as UTF-8 text (a byte order mark is dropped).

    @raise FileError: naming the line and byte of the first invalid sequence.
    """
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        where = f", line {line}" if b"\n" in data else ""
        raise FileError(f"{label}{where}: not UTF-8 text ({e.reason} at byte {e.start})") from None


# ---------------------------------------------------------------- JSON


def parse_json(data: bytes, label: str, depth: int = MAX_DEPTH) -> Any:
    """
    One JSON document, bounded as reviews are (C{depth}: what wraps a
    review, such as a recording's line, may nest a few levels more).

    @raise FileError: not UTF-8, nested deeper than C{depth}, not JSON, or
        holding C{NaN}, C{Infinity}, a number out of range, or a string
        that is not valid Unicode (a lone surrogate escape, L{amp.text}).
    """
    text = text_of(data, label)
    if nesting_exceeds(data, depth):
        raise FileError(f"{label} nests arrays and objects more than {depth} deep, the limit")
    try:
        doc = decode_bounded(text)
    except ValueError as e:
        raise FileError(f"{label} is not valid JSON: {' '.join(str(e).split())}") from None
    surrogate = lone_surrogate(doc) if may_hold_surrogate(data) else None
    if surrogate is not None:
        raise FileError(f"{label} holds a string that is not valid Unicode (a lone surrogate escape) at {surrogate}")
    return doc


# ---------------------------------------------------------------- YAML

_TAG = "tag:yaml.org,2002:"
#: The tags of what JSON can say; None is the constructor that refuses any other tag.
_JSON_TAGS = {f"{_TAG}{t}" for t in ("null", "bool", "int", "float", "str", "seq", "map")} | {None}
#: Implicit types amp does not build: an unquoted date stays a string, and
#: so does a lone C{=}.
_UNRESOLVED = {f"{_TAG}timestamp", f"{_TAG}value"}


def _construct_int(loader: SafeConstructor, node: yaml.ScalarNode) -> int:
    if len(str(node.value)) > _INT_TEXT_MAX:
        raise ConstructorError(
            None, None, f"integer {str(node.value)[:40]}... is out of range (64 bits)", node.start_mark
        )
    value = SafeConstructor.construct_yaml_int(loader, node)
    if not _INT_RANGE[0] <= value <= _INT_RANGE[1]:
        raise ConstructorError(None, None, f"integer {node.value} is out of range (64 bits)", node.start_mark)
    return value


def _construct_float(loader: SafeConstructor, node: yaml.ScalarNode) -> float:
    value = SafeConstructor.construct_yaml_float(loader, node)
    if not math.isfinite(value):
        raise ConstructorError(
            None, None, f"{str(node.value)[:40]} is not a finite number (NaN and Infinity are refused)", node.start_mark
        )
    return value


class _Loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]  # libyaml's when built with it
    """
    YAML as amp reads it: only what JSON can say, numbers in range
    (libyaml's parser when PyYAML has it).
    """


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in _UNRESOLVED]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.yaml_constructors = {tag: f for tag, f in SafeConstructor.yaml_constructors.items() if tag in _JSON_TAGS}
_Loader.yaml_constructors[f"{_TAG}int"] = _construct_int
_Loader.yaml_constructors[f"{_TAG}float"] = _construct_float
_Loader.yaml_multi_constructors = {}


def _yaml_problem(error: yaml.YAMLError) -> str:
    """
    A YAML error on one line: where, what, and in what (PyYAML's own text
    spans several lines with a copy of the offending line).
    """
    mark = getattr(error, "problem_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    text = f"line {mark.line + 1}, column {mark.column + 1}: {problem}" if mark is not None else problem
    if context:
        text += f" ({context})"
    return " ".join(text.split())


def _bound_yaml(text: str, label: str, *, aliases: bool) -> None:
    """
    Walk the parser's events (no object is built) and refuse a file nested
    deeper than L{MAX_DEPTH}, or, with C{aliases}, one that expands past
    L{MAX_NODES} nodes or L{MAX_DEPTH} levels or refers to itself;
    without, one that uses an anchor or alias at all.

    Each anchored node's size and height are remembered when it ends, so an
    alias adds what it would expand to in constant time.
    """
    anchors: dict[Optional[str], tuple[int, int]] = {}  # name -> (nodes, height) of the anchored node
    unfinished: set[str] = set()  # anchors of collections still open
    stack: list[list[Any]] = []  # per open collection: [nodes before it, anchor, height of its tallest child]
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        anchor = getattr(event, "anchor", None)
        if anchor is not None and not aliases:
            sign = "*" if isinstance(event, AliasEvent) else "&"
            raise FileError(
                f"{label}, line {_line(event)}: anchors and aliases are not allowed "
                f"in amp's config (found {sign}{anchor})"
            )
        if isinstance(event, (SequenceStartEvent, MappingStartEvent)):
            stack.append([total, anchor, 0])
            total += 1
            if len(stack) > MAX_DEPTH:
                raise FileError(f"{label}, line {_line(event)}: nests more than {MAX_DEPTH} levels deep, the limit")
            if anchor is not None:
                unfinished.add(anchor)
            continue
        if isinstance(event, (SequenceEndEvent, MappingEndEvent)):
            start, anchor, tallest = stack.pop()
            nodes, height = total - start, tallest + 1
            if anchor is not None:
                unfinished.discard(anchor)
        elif isinstance(event, ScalarEvent):
            nodes, height = 1, 0
            total += 1
        elif isinstance(event, AliasEvent):
            if anchor in unfinished:
                raise FileError(f"{label}, line {_line(event)}: alias *{anchor} refers to the node it is in")
            nodes, height = anchors.get(anchor, (1, 0))
            total += nodes
            if len(stack) + height > MAX_DEPTH:
                raise FileError(
                    f"{label}, line {_line(event)}: alias *{anchor} nests it more than "
                    f"{MAX_DEPTH} levels deep, the limit"
                )
        else:
            if isinstance(event, DocumentStartEvent):
                anchors.clear()
            continue
        if anchor is not None and not isinstance(event, AliasEvent):
            anchors[anchor] = (nodes, height)
        if stack and height > stack[-1][2]:
            stack[-1][2] = height
        if total > MAX_NODES:
            raise FileError(
                f"{label}, line {_line(event)}: has more than {MAX_NODES} nodes with its aliases expanded, the limit"
            )


def _line(event: yaml.Event) -> int:
    """The line C{event} starts on, from 1 (0: unknown; the parser always knows)."""
    mark = event.start_mark
    return mark.line + 1 if mark is not None else 0


def _load_yaml(data: bytes, label: str, *, aliases: bool, many: bool) -> Any:
    text = text_of(data, label)
    try:
        _bound_yaml(text, label, aliases=aliases)
        if many:
            return [d for d in yaml.load_all(text, Loader=_Loader) if d is not None]
        return yaml.load(text, Loader=_Loader)  # noqa: S506 (a safe loader: JSON types only)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        if mark is not None and "maximum nesting depth" in str(getattr(e, "problem", "")):
            # libyaml's own bound (1000 flow levels), met before the events
            # reach the count above: the same refusal, with amp's limit.
            raise FileError(
                f"{label}, line {mark.line + 1}: nests more than {MAX_DEPTH} levels deep, the limit"
            ) from None
        raise FileError(f"{label} is not valid YAML: {_yaml_problem(e)}") from None


def config_document(data: bytes, label: str) -> Any:
    """
    amp's own config: one YAML document, without anchors or aliases.

    @raise FileError: naming the file, the line and the problem.
    """
    return _load_yaml(data, label, aliases=False, many=False)


def parse_documents(data: bytes, label: str) -> list[Any]:
    """
    The documents of a YAML or JSON file (JSON when it starts with C{{} or
    C{[}); aliases are allowed within L{MAX_NODES} and L{MAX_DEPTH}.

    @raise FileError: naming the file, the line where known and the problem.
    """
    text = text_of(data, label)
    if text.lstrip().startswith(("{", "[")):
        return [parse_json(data, label)]
    documents: list[Any] = _load_yaml(data, label, aliases=True, many=True)
    return documents
