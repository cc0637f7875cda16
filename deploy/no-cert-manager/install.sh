#!/bin/sh
# Install amp without cert-manager.
#
#   deploy/no-cert-manager/install.sh [TLS_DIR]
#
# 1. `python -m amp_dev.devcert TLS_DIR` writes a private CA and a serving
#    certificate for amp.amp-system.svc (TLS_DIR defaults to ./amp-tls; the
#    CA is kept when the directory already holds a usable one).
# 2. The serving certificate becomes the Secret amp-system/amp-tls.
# 3. The manifests of ../base are applied, then the webhook registration
#    with the CA as its caBundle.
#
# Run it again to renew the serving certificate: the CA (and so the
# caBundle) stays, amp picks up the new Secret without a restart.
# TLS_DIR holds the CA's private key: keep it somewhere safe, not in git.
#
# Needs kubectl (1.14+, for apply -k) and Python with amp-examples installed
# (PYTHON, default python3).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
tls_dir=${1:-amp-tls}
python=${PYTHON:-python3}

"$python" -m amp_dev.devcert "$tls_dir" --hosts amp.amp-system.svc,amp.amp-system.svc.cluster.local >/dev/null

kubectl apply -f "$here/../base/namespace.yaml"
kubectl -n amp-system create secret generic amp-tls --type=kubernetes.io/tls \
    --from-file=tls.crt="$tls_dir/tls.crt" \
    --from-file=tls.key="$tls_dir/tls.key" \
    --from-file=ca.crt="$tls_dir/ca.crt" \
    --dry-run=client -o yaml | kubectl apply -f -

kubectl apply -k "$here/../base"

ca_bundle=$(base64 < "$tls_dir/ca.crt" | tr -d '\n')
sed "s|\${CA_BUNDLE}|$ca_bundle|" "$here/mutatingwebhookconfiguration.yaml" | kubectl apply -f -
