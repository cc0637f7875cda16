//go:build tools

// Package e2e records the Go programs the end-to-end tests run, so that
// go.mod keeps requiring them.
package e2e

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
)
