// Package policies holds the shipped Rego policies. They are embedded so that `broker dev`
// runs without a policies directory, and tested by `go test` (policies_test.go).
package policies

import "embed"

// FS holds the shipped policies and their tests.
//
//go:embed *.rego
var FS embed.FS
