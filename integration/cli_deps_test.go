package integration

// The tests build cmd/idemq inside this module (buildExample): its
// dependencies must be in this module's go.mod, which `go mod tidy` keeps
// only for packages imported here.
import _ "github.com/spf13/cobra"
