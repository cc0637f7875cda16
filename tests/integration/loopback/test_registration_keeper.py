"""
The managed registration's apply on the wire
(L{amp.kube.KubeClient.apply_webhook_configuration}): a server-side apply
under amp's field manager, against the fake API server on loopback
(L{tests.support.fake_apiserver}).  The keeper's rules, on a ThreadReactor
with an in-memory Kubernetes, are in
tests/unit/registration/test_registration_keeper.py, whose helpers these
tests share.
"""

from __future__ import annotations

import dataclasses

from kubernetes.client.exceptions import ApiException
from twisted.trial.unittest import SynchronousTestCase

from amp.registration import desired
from tests.unit.registration.test_registration_keeper import CA_PEM, managed_config


class ApplyOnTheWireTests(SynchronousTestCase):
    """KubeClient.apply_webhook_configuration against the fake API server on loopback."""

    def test_a_server_side_apply_under_amps_field_manager(self) -> None:
        import os
        import tempfile

        from amp.kube import KubeClient
        from tests.support.fake_apiserver import FakeKube

        with FakeKube() as fake, tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "kubeconfig")
            with open(path, "w") as f:
                f.write(
                    f'apiVersion: v1\nkind: Config\nclusters: [{{name: f, cluster: {{server: "{fake.url}"}}}}]\n'
                    "users: [{name: amp, user: {token: t}}]\n"
                    "contexts: [{name: f, context: {cluster: f, user: amp}}]\ncurrent-context: f\n"
                )
            config = managed_config()
            client = KubeClient.from_config(
                dataclasses.replace(config.kubernetes, source="kubeconfig", kubeconfig=path)
            )
            try:
                want = desired(config, CA_PEM, "amp-system")
                stored = client.apply_webhook_configuration(want, 5.0)
                [(query, body)] = fake.applied
                self.assertEqual(query, {"fieldManager": "amp", "force": "true"})
                self.assertEqual(body, want)
                self.assertEqual(
                    [e["name"] for e in stored["webhooks"]], ["ignore.mutate.amp.txn2.com", "fail.mutate.amp.txn2.com"]
                )
                [request] = [r for r in fake.requests if r.method == "PATCH"]
                self.assertEqual(
                    request.path, "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/amp.txn2.com"
                )
                fake.fail_next(1, 403)
                with self.assertRaises(ApiException) as raised:
                    client.apply_webhook_configuration(want, 5.0)
                self.assertEqual(raised.exception.status, 403)
                self.assertEqual(fake.errors, [])
            finally:
                client.close()
