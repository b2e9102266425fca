// Package docscheck holds tests that keep the documentation under docs/ in
// step with the code. It has no non-test code.
//
// TestConfigurationDocCoversEveryField parses the Go source of the module's
// public packages (go/parser, go/ast; no build, no service), finds every
// exported struct type whose name ends in "Config" or "Options", plus the
// few other configuration structs listed in extraStructs, and requires
// docs/configuration.md to have, under a heading naming the struct as
// "`package.Type`", one table row per exported field whose first cell is
// "`FieldName`" and whose other cells are filled in. It also fails on a row
// or a section naming a field or struct that no longer exists. Add a field
// to a Config struct and `go test ./...` fails until the field is
// documented.
//
// The other tests hold the docs to the shipped files: the README's Go
// blocks are copied from Examples (TestDocSnippetsCompile), operations.md's
// alert table is deploy/prometheus/idemq-alerts.yml
// (TestAlertTableMatchesShippedRules), every idemq_* metric the docs and
// deploy/ name is defined in the code (TestDocsNameOnlyRealMetrics), and the
// README's `go get` names the version it describes
// (TestReadmeNamesTheVersionItDescribes). cmd/idemq's TestDocsCommandLinesExist
// checks the documented command lines against the CLI.
package docscheck
