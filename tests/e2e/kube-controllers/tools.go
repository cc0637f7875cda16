//go:build tools

// Package kubecontrollers records the Go programs the end-to-end tests run when a
// test needs controllers, so that go.mod keeps requiring them.
package kubecontrollers

import (
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
)
