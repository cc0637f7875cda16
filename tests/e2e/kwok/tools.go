//go:build tools

// Package kwok records the Go program the end-to-end tests run for fake nodes,
// so that go.mod keeps requiring it.
package kwok

import (
	_ "sigs.k8s.io/kwok/cmd/kwok"
)
