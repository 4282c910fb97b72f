package npapiconformance

import "embed"

// Manifests holds the suite's base manifests, copied from the pinned module at build
// time by hack/build-e2e.sh (with a variant whose SCTP servers are left out).
//
//go:embed base
var Manifests embed.FS
