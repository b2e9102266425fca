// Package archcheck holds no code: its tests enforce the module's layering
// rules (which package may import which) and the wire contract's "defined
// once" rule, so that a change breaking them fails `go test ./...`.
//
// The import rules are a table in archcheck_test.go (importRules); add a row
// for a new rule. They read `go list -deps -json ./...`, so they see
// transitive imports and need the go command on PATH.
package archcheck
