package archcheck

import (
	"bytes"
	"encoding/json"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/idemq/idemq/wire"
)

// module is the module path; rules name packages relative to it.
const module = "github.com/idemq/idemq"

// pkg is the part of `go list -json` the rules read.
type pkg struct {
	ImportPath string
	Standard   bool
	Deps       []string
	Module     *struct{ Path string }
}

// importRule forbids packages matching From to depend, directly or
// transitively, on packages for which Forbidden returns true.
type importRule struct {
	name string
	// from reports whether the rule applies to a package of this module
	// (path relative to the module, e.g. "outbox/kafkapub").
	from func(rel string) bool
	// forbidden reports whether a dependency breaks the rule; std tells
	// whether it is in the standard library.
	forbidden func(dep string, std bool) bool
}

// under reports whether rel is dir or below it.
func under(dir string) func(string) bool {
	return func(rel string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }
}

// ofModule reports whether dep is a package of this module under one of dirs.
func ofModule(dirs ...string) func(string, bool) bool {
	return func(dep string, _ bool) bool {
		rel, ok := strings.CutPrefix(dep, module+"/")
		return ok && slices.ContainsFunc(dirs, func(d string) bool { return under(d)(rel) })
	}
}

var importRules = []importRule{
	{
		// The relay and its publishers must not link the consumer runtime
		// (or, through it, the broker adapters and Prometheus collectors of
		// the consumer side): shared code lives in internal/ or wire/. The
		// one exception is broker/kafkasec, the Kafka TLS/SASL settings that
		// consumer and relay share, which imports nothing of this module (next
		// rule).
		name: "outbox imports nothing under broker/ or consumer/ but broker/kafkasec",
		from: under("outbox"),
		forbidden: func(dep string, std bool) bool {
			return dep != module+"/broker/kafkasec" && ofModule("broker", "consumer")(dep, std)
		},
	},
	{
		// Both sides link the Kafka security settings: they stay a leaf.
		name:      "broker/kafkasec imports no other package of this module",
		from:      under("broker/kafkasec"),
		forbidden: func(dep string, _ bool) bool { return strings.HasPrefix(dep, module+"/") },
	},
	{
		// Any producer, in any service, can import the wire contract
		// without a broker client or database driver.
		name:      "wire imports only the standard library",
		from:      under("wire"),
		forbidden: func(_ string, std bool) bool { return !std },
	},
	{
		// The stores sit below the runtime and the brokers: a store never
		// depends on who drives it.
		name:      "nothing under dedup/ imports consumer/, broker/ or outbox/",
		from:      under("dedup"),
		forbidden: ofModule("consumer", "broker", "outbox"),
	},
	{
		// The core is driver-free: identity, outcomes and the Store
		// interfaces link no database or Redis client, so an HTTP layer, a
		// new store or a user's unit test can import it alone.
		name: "dedup (the core) imports no database or Redis client",
		from: func(rel string) bool { return rel == "dedup" },
		forbidden: func(dep string, _ bool) bool {
			return strings.HasPrefix(dep, "github.com/jackc/") || strings.HasPrefix(dep, "github.com/redis/")
		},
	},
	{
		// The fault proxy is a test helper (it imports testing): only test
		// files import it, so no library or binary links it. (go list -deps
		// without -test sees no test imports.)
		name:      "only tests import internal/faultproxy and internal/testkit",
		from:      func(rel string) bool { return rel != "internal/faultproxy" && rel != "internal/testkit" },
		forbidden: ofModule("internal/faultproxy", "internal/testkit"),
	},
	{
		// The HTTP-side guards stand alone: a form handler or a message
		// handler uses them without linking idemq's stores, runtime or
		// brokers.
		name:      "submittoken and transition import no other package of this module",
		from:      func(rel string) bool { return under("submittoken")(rel) || under("transition")(rel) },
		forbidden: func(dep string, _ bool) bool { return strings.HasPrefix(dep, module+"/") },
	},
}

func listPackages(t *testing.T) map[string]pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-json", "./...")
	cmd.Dir = moduleRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := map[string]pkg{}
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs[p.ImportPath] = p
	}
	return pkgs
}

func TestImportRules(t *testing.T) {
	pkgs := listPackages(t)
	for _, r := range importRules {
		t.Run(r.name, func(t *testing.T) {
			checked := 0
			for path, p := range pkgs {
				if p.Module == nil || p.Module.Path != module {
					continue
				}
				rel := strings.TrimPrefix(strings.TrimPrefix(path, module), "/")
				if !r.from(rel) {
					continue
				}
				checked++
				for _, d := range p.Deps {
					if r.forbidden(d, pkgs[d].Standard) {
						t.Errorf("%s depends on %s", path, d)
					}
				}
			}
			if checked == 0 {
				t.Fatal("the rule matched no package: fix its from")
			}
		})
	}
}

// The rules must catch what they forbid: a fake graph where outbox/kafkapub
// reaches consumer/ and wire reaches pgx breaks both.
func TestImportRulesCatchViolations(t *testing.T) {
	bad := map[string][]string{
		"outbox/kafkapub": {module + "/broker/kafkaadapter", module + "/consumer"},
		"wire":            {"github.com/jackc/pgx/v5"},
		"dedup/pgstore":   {module + "/consumer"},
		"dedup":           {"github.com/redis/go-redis/v9"},
		"consumer":        {module + "/internal/faultproxy"},
		"transition":      {module + "/dedup"},
		"broker/kafkasec": {module + "/wire"},
	}
	for _, r := range importRules {
		caught := false
		for rel, deps := range bad {
			for _, d := range deps {
				caught = caught || (r.from(rel) && r.forbidden(d, false))
			}
		}
		if !caught {
			t.Errorf("rule %q does not catch its violation", r.name)
		}
	}
}

// wireNames are the wire contract's names: as string literals they may
// appear in non-test Go files under wire/ only. Everywhere else, code uses
// the wire constants (tests may use literals, and comments are free).
var wireNames = []string{wire.MessageIDHeader, wire.CausationHeader}

func TestWireNamesDefinedOnce(t *testing.T) {
	root := moduleRoot(t)
	var found []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			// integration/ and tools/ are modules of their own; wire/ is
			// where the names are defined.
			if rel == "wire" || rel == "integration" || rel == "tools" || strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		hits, err := wireLiterals(path)
		for _, h := range hits {
			found = append(found, rel+":"+h)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Errorf("%s: use the wire package's constant instead of the literal", f)
	}
}

// wireLiterals returns "line: literal" for each string literal in file that
// spells a wire name, except flag names (the first argument of a
// flag.FlagSet method such as String or StringVar's second): a command-line
// flag called -message-id is not the header.
func wireLiterals(file string) ([]string, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	flagNames := map[*ast.BasicLit]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok {
			return true
		}
		name := sel.Sel.Name
		idx := 0
		if strings.HasSuffix(name, "Var") {
			idx = 1 // fs.StringVar(&v, "name", …)
		}
		isFlag := slices.Contains([]string{"String", "Bool", "Int", "Int64", "Uint", "Uint64", "Float64", "Duration", "Func", "BoolFunc", "TextVar"}, strings.TrimSuffix(name, "Var"))
		if isFlag && len(call.Args) > idx {
			if lit, ok := call.Args[idx].(*ast.BasicLit); ok {
				flagNames[lit] = true
			}
		}
		return true
	})
	var hits []string
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.BasicLit)
		if !ok || lit.Kind != token.STRING || flagNames[lit] {
			return true
		}
		v, err := strconv.Unquote(lit.Value)
		if err == nil && slices.Contains(wireNames, v) {
			hits = append(hits, strconv.Itoa(fset.Position(lit.Pos()).Line)+": "+lit.Value)
		}
		return true
	})
	return hits, nil
}

// The literal check must catch a redefinition, and spare flag names.
func TestWireLiteralsCatchRedefinition(t *testing.T) {
	file := filepath.Join(t.TempDir(), "x.go")
	id, cause := strconv.Quote(wire.MessageIDHeader), "`"+wire.CausationHeader+"`"
	src := "package x\n\nimport \"flag\"\n\nconst Header = " + id + "\n\nvar fs flag.FlagSet\nvar id = fs.String(" + id + ", \"\", \"a flag, not the header\")\nvar cause = map[string]string{" + cause + ": \"c\"}\n"
	if err := os.WriteFile(file, []byte(src), 0o600); err != nil {
		t.Fatal(err)
	}
	hits, err := wireLiterals(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"5: " + id, "9: " + cause}; !slices.Equal(hits, want) {
		t.Fatalf("hits = %q, want %q", hits, want)
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("module root not found at %s: %v", dir, err)
	}
	return dir
}
