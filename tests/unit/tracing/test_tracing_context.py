"""
Tests for amp.tracing's pure parts: W3C trace context read and written
(malformed headers ignored, as the specification says), the parent-based
sampling decision, the config and OTEL_* variables resolved (which wins),
and a review's span records.
"""

from __future__ import annotations

import random

from twisted.trial.unittest import SynchronousTestCase

from amp.config import ConfigError, parse_config
from amp.tracing import (
    MAX_TRACESTATE,
    Ids,
    Parent,
    ReviewSpans,
    Sampler,
    format_traceparent,
    parse_traceparent,
    resolve,
    sampled_by_ratio,
)

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
HEADER = f"00-{TRACE}-{SPAN}-01".encode()


class TraceparentTests(SynchronousTestCase):
    def test_a_valid_header_is_read(self) -> None:
        parent = parse_traceparent(HEADER, b"congo=t61rcWkgMzE")
        self.assertEqual(parent, Parent(int(TRACE, 16), int(SPAN, 16), True, b"congo=t61rcWkgMzE"))

    def test_the_sampled_flag_is_bit_zero(self) -> None:
        self.assertFalse(parse_traceparent(HEADER[:-2] + b"00").sampled)  # type: ignore[union-attr]
        self.assertTrue(parse_traceparent(HEADER[:-2] + b"03").sampled)  # type: ignore[union-attr]

    def test_malformed_headers_are_ignored(self) -> None:
        bad = [
            b"",
            b"00",
            HEADER.upper(),
            HEADER.replace(b"-", b"_"),
            b"ff" + HEADER[2:],
            b"00-" + b"0" * 32 + b"-" + SPAN.encode() + b"-01",  # all-zero trace id
            b"00-" + TRACE.encode() + b"-" + b"0" * 16 + b"-01",  # all-zero span id
            HEADER + b"-extra",  # version 00 has exactly four fields
            HEADER[:-1],
            b"00-" + TRACE.encode() + b"-" + SPAN.encode() + b"-0g",
        ]
        for value in bad:
            self.assertIsNone(parse_traceparent(value), value)

    def test_a_later_version_is_read_by_its_first_fields(self) -> None:
        parent = parse_traceparent(b"01" + HEADER[2:] + b"-what-comes-later")
        self.assertIsNotNone(parent)
        self.assertEqual(parent.trace_id, int(TRACE, 16))  # type: ignore[union-attr]
        self.assertIsNone(parse_traceparent(b"01" + HEADER[2:] + b"x"))

    def test_tracestate_too_long_or_with_control_characters_is_dropped(self) -> None:
        self.assertEqual(parse_traceparent(HEADER, b"a=" + b"b" * MAX_TRACESTATE).tracestate, b"")  # type: ignore
        self.assertEqual(parse_traceparent(HEADER, b"a=b\x01").tracestate, b"")  # type: ignore[union-attr]

    def test_written_as_read(self) -> None:
        self.assertEqual(format_traceparent(int(TRACE, 16), int(SPAN, 16), True), HEADER)
        self.assertEqual(format_traceparent(1, 2, False), b"00-" + b"0" * 31 + b"1-" + b"0" * 15 + b"2-00")


class SamplingTests(SynchronousTestCase):
    def test_parent_based_follows_the_callers_flag_whatever_the_ratio(self) -> None:
        sampled, unsampled = Parent(5, 6, True), Parent(5, 6, False)
        self.assertTrue(Sampler(0.0).decide(sampled, 5))
        self.assertFalse(Sampler(1.0).decide(unsampled, 5))

    def test_not_parent_based_ignores_the_caller(self) -> None:
        self.assertFalse(Sampler(0.0, parent_based=False).decide(Parent(5, 6, True), 5))

    def test_the_ratio_compares_the_low_64_bits_as_the_sdk_does(self) -> None:
        self.assertTrue(sampled_by_ratio((7 << 64) | 0, 0.5))
        self.assertFalse(sampled_by_ratio((1 << 63), 0.5))
        self.assertFalse(sampled_by_ratio(1, 0.0))
        self.assertTrue(sampled_by_ratio((1 << 64) - 1, 1.0))

    def test_the_share_sampled_is_the_ratio(self) -> None:
        ids = Ids(random.Random(4))
        sampled = sum(Sampler(0.1).decide(None, ids.trace_id()) for _ in range(20000))
        self.assertTrue(1700 < sampled < 2300, sampled)


class SettingsTests(SynchronousTestCase):
    def config(self, **tracing: object) -> object:
        return parse_config({"tracing": tracing}).tracing

    def test_off_by_default(self) -> None:
        self.assertFalse(resolve(parse_config({}).tracing, {}).enabled)

    def test_otel_sdk_disabled_keeps_it_off(self) -> None:
        self.assertFalse(resolve(self.config(enabled=True), {"OTEL_SDK_DISABLED": "true"}).enabled)
        self.assertTrue(resolve(self.config(enabled=True), {"OTEL_SDK_DISABLED": "false"}).enabled)

    def test_the_configs_ratio_wins_over_the_environment(self) -> None:
        env = {"OTEL_TRACES_SAMPLER": "always_off"}
        self.assertEqual(resolve(self.config(enabled=True, sampling_ratio=0.25), env).sampler, Sampler(0.25, True))

    def test_a_null_ratio_defers_to_otel_traces_sampler(self) -> None:
        cases = {
            ("traceidratio", "0.5"): Sampler(0.5, False),
            ("parentbased_traceidratio", "0.01"): Sampler(0.01, True),
            ("always_off", ""): Sampler(0.0, False),
            ("parentbased_always_on", ""): Sampler(1.0, True),
        }
        for (name, arg), expected in cases.items():
            env = {"OTEL_TRACES_SAMPLER": name, "OTEL_TRACES_SAMPLER_ARG": arg}
            self.assertEqual(resolve(self.config(enabled=True), env).sampler, expected, name)
        self.assertEqual(resolve(self.config(enabled=True), {}).sampler, Sampler(1.0, True))

    def test_an_unknown_sampler_or_bad_argument_is_named(self) -> None:
        settings = resolve(self.config(enabled=True), {"OTEL_TRACES_SAMPLER": "jaeger_remote"})
        self.assertEqual(settings.sampler, Sampler(1.0, True))
        self.assertIn("jaeger_remote", settings.problems[0])
        settings = resolve(
            self.config(enabled=True), {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}
        )
        self.assertIn("OTEL_TRACES_SAMPLER_ARG='2'", settings.problems[0])

    def test_service_name_from_the_config_else_the_environment_else_amp(self) -> None:
        self.assertEqual(
            resolve(self.config(service_name="amp-prod"), {"OTEL_SERVICE_NAME": "x"}).exporting.service_name, "amp-prod"
        )
        self.assertIsNone(resolve(self.config(), {"OTEL_SERVICE_NAME": "x"}).exporting.service_name)
        self.assertIsNone(
            resolve(self.config(), {"OTEL_RESOURCE_ATTRIBUTES": "a=b,service.name=y"}).exporting.service_name
        )
        self.assertEqual(resolve(self.config(), {}).exporting.service_name, "amp")

    def test_endpoint_and_headers_left_to_the_exporter_when_unset(self) -> None:
        exporting = resolve(self.config(), {}).exporting
        self.assertIsNone(exporting.endpoint)
        self.assertIsNone(exporting.headers)
        exporting = resolve(self.config(endpoint="http://collector:4317", headers={"api-key": "k"}), {}).exporting
        self.assertEqual((exporting.endpoint, exporting.headers), ("http://collector:4317", (("api-key", "k"),)))

    def test_bad_values_are_named(self) -> None:
        for tracing, expected in [
            ({"sampling_ratio": 1.5}, "tracing.sampling_ratio"),
            ({"protocol": "http/json"}, "tracing.protocol"),
            ({"endpoint": "collector:4317"}, "tracing.endpoint: expected an http:// or https:// URL"),
            ({"batch": 100, "queue": 10}, "tracing.batch: 100 spans is more than tracing.queue"),
            ({"headers": {"a": 1}}, "tracing.headers"),
        ]:
            with self.assertRaises(ConfigError) as e:
                parse_config({"tracing": tracing})
            self.assertIn(expected, str(e.exception))


class ReviewSpansTests(SynchronousTestCase):
    def test_an_endpoint_call_carries_its_own_span_in_the_callers_trace(self) -> None:
        parent = parse_traceparent(HEADER, b"k=v")
        spans = ReviewSpans(Ids(random.Random(1)), parent, parent.trace_id, 10.0)  # type: ignore[union-attr]
        header = spans.call_started(10.5, {"url.full": "http://e:8080/mutate"})
        call = spans.children[0]
        self.assertEqual(header, format_traceparent(int(TRACE, 16), call.span_id, True))
        self.assertNotEqual(call.span_id, spans.span_id)
        self.assertEqual(spans.tracestate, b"k=v")
        spans.call_ended(10.75, "timeout: took too long", **{"amp.connection": "new"})
        self.assertEqual((call.start, call.end, call.error), (10.5, 10.75, "timeout: took too long"))
        self.assertEqual(call.attributes, {"url.full": "http://e:8080/mutate", "amp.connection": "new"})

    def test_not_sampled_passes_the_callers_span_on_unsampled_and_records_nothing(self) -> None:
        parent = parse_traceparent(HEADER)
        spans = ReviewSpans(Ids(), parent, parent.trace_id, 0.0, sampled=False)  # type: ignore[union-attr]
        self.assertEqual(spans.call_started(1.0, {}), HEADER[:-2] + b"00")
        self.assertEqual(spans.children, [])
