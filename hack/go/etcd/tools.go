//go:build tools

// Package tools records the upstream commands this wrapper module builds.
package tools

import (
	_ "go.etcd.io/etcd/server/v3"
)
