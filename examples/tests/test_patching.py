"""Tests for amp_examples.patching: the PatchBuilder every example uses."""

from __future__ import annotations

import pytest
from podfixtures import apply

from amp_examples.patching import PatchBuilder


def test_builder_creates_missing_lists_and_objects_then_appends():
    b = PatchBuilder({"metadata": {}, "spec": {"containers": [{"name": "a"}]}})
    b.append(["spec", "containers", 0, "env"], {"name": "A", "value": "1"})
    b.append(["spec", "containers", 0, "env"], {"name": "B", "value": "2"})
    b.put(["metadata", "annotations"], "example.com/key", "v")
    assert b.ops == [
        {"op": "add", "path": "/spec/containers/0/env", "value": [{"name": "A", "value": "1"}]},
        {"op": "add", "path": "/spec/containers/0/env/-", "value": {"name": "B", "value": "2"}},
        {"op": "add", "path": "/metadata/annotations", "value": {}},
        {"op": "add", "path": "/metadata/annotations/example.com~1key", "value": "v"},
    ]
    assert apply({"metadata": {}, "spec": {"containers": [{"name": "a"}]}}, b.ops) == b.doc


def test_builder_refuses_to_append_to_a_non_list():
    b = PatchBuilder({"spec": {"volumes": {"oops": True}}})
    with pytest.raises(ValueError):
        b.append(["spec", "volumes"], {"name": "v"})
