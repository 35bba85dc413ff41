// Package policies holds the shipped Rego policies, their tests and their data. They are
// embedded so that `broker dev` runs without a policies directory, and tested by `go test`
// (policies_test.go): the Rego tests, and `opa fmt` formatting.
package policies

import "embed"

// FS holds the shipped policies, their tests and their data files.
//
//go:embed *.rego *.yaml
var FS embed.FS
