//go:build tools

// Package etcd records the etcd server program the end-to-end tests run, so
// that go.mod keeps requiring it.
package etcd

import (
	_ "go.etcd.io/etcd/server/v3"
)
