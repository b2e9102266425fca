package pgstore

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// The handler gets idemq's own pgx.Tx wrappers, which embed the real
// transaction: a method pgx adds to Tx would be promoted from the embedded
// one and silently skip the wrapper's work (savepointTx: the pending
// savepoint; causeTx: the watch of the handler's statements). Every method
// of pgx.Tx is therefore declared on each wrapper, or listed here as
// delegated on purpose; a new one fails this test by name.
func TestTxWrappersDeclareEveryTxMethod(t *testing.T) {
	declared := map[string][]string{} // receiver type -> methods declared on it
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	var files []*ast.File
	for _, e := range entries {
		if n := e.Name(); strings.HasSuffix(n, ".go") && !strings.HasSuffix(n, "_test.go") {
			f, err := parser.ParseFile(fset, n, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
	}
	for _, f := range files {
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv == nil || len(fn.Recv.List) != 1 {
				continue
			}
			typ := fn.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				declared[id.Name] = append(declared[id.Name], fn.Name.Name)
			}
		}
	}
	tx := reflect.TypeFor[pgx.Tx]()
	for wrapper, delegated := range map[string][]string{
		"savepointTx": nil,
		// causeTx watches what the handler sends; these send nothing the
		// handler wrote, or hand out the connection (Conn) for the caller's
		// own use.
		"causeTx": {"Conn", "LargeObjects", "Rollback"},
	} {
		if len(declared[wrapper]) == 0 {
			t.Fatalf("no methods found on %s: renamed?", wrapper)
		}
		for i := range tx.NumMethod() {
			m := tx.Method(i).Name
			if !slices.Contains(declared[wrapper], m) && !slices.Contains(delegated, m) {
				t.Errorf("pgx.Tx.%s is promoted from the transaction %s embeds: declare it on %s (or list it as delegated on purpose)", m, wrapper, wrapper)
			}
		}
	}
}
