package docscheck

import (
	"bufio"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// modulePath is the module whose packages are checked.
const modulePath = "github.com/idemq/idemq"

// configDoc is the document checked, relative to the module root.
const configDoc = "docs/configuration.md"

// extraStructs are configuration structs checked although their names do not
// end in Config or Options: they are fields of, or inputs to, a Config.
var extraStructs = map[string]bool{
	"dedup.FingerprintKey": true, // dedup.NewFingerprinter's keys (pgstore.Config.Fingerprinter)
	"pgstore.RetryPolicy":  true, // pgstore.Config.TransientRetry, OutcomeUnknownRetry
}

// skipDirs are directories whose packages are not part of the public API:
// internal packages, runnable examples (package main), docs and caches.
// Directories holding their own go.mod (integration, tools) are other
// modules and are skipped too.
var skipDirs = map[string]bool{
	"internal": true, "examples": true, "docs": true, "testdata": true, "scripts": true,
}

// configStruct is one struct whose fields must be documented.
type configStruct struct {
	Name   string   // "consumer.Config"
	File   string   // file it is declared in, relative to the module root
	Fields []string // exported field names, in declaration order
}

func TestConfigurationDocCoversEveryField(t *testing.T) {
	root := moduleRoot(t)
	structs, err := findConfigStructs(root)
	if err != nil {
		t.Fatal(err)
	}
	// The scan itself must find what this test exists for; an empty or
	// shrunken result means it is broken, not that all is documented.
	for _, want := range []string{"consumer.Config", "pgstore.Config", "dedup.LeaseOptions", "kafkaadapter.Config",
		"rocketmqadapter.Config", "outbox.Config", "outbox.RelayConfig", "redisfast.Config", "redisstore.Config",
		"kafkapub.Config", "rocketmqpub.Config"} {
		if !hasStruct(structs, want) {
			t.Errorf("the source scan did not find %s: fix findConfigStructs (or this list, if the type was renamed)", want)
		}
	}
	doc, err := os.ReadFile(filepath.Join(root, configDoc))
	if err != nil {
		t.Fatalf("%s is missing: %v", configDoc, err)
	}
	for _, p := range check(structs, string(doc)) {
		t.Error(p)
	}
}

// TestCheckReportsMissingAndStaleRows shows that check can fail: on a
// document missing a field, a struct, a value, or naming a field that is
// gone.
func TestCheckReportsMissingAndStaleRows(t *testing.T) {
	structs := []configStruct{
		{Name: "demo.Config", File: "demo/config.go", Fields: []string{"Alpha", "Beta"}},
		{Name: "demo.Options", File: "demo/options.go", Fields: []string{"Gamma"}},
	}
	doc := "# Configuration\n\n## `demo.Config`\n\n" +
		"| field | type | default | range, unit | meaning |\n| --- | --- | --- | --- | --- |\n" +
		"| `Alpha` | `int` | 5 | 1 to 10 | how many |\n" +
		"| `Gone` | `int` | 1 | ≥ 1 | a removed field |\n" +
		"| `Beta` | `string` |  | any | no default given |\n" +
		"\n## `demo.Removed`\n\nA struct that no longer exists.\n"
	got := strings.Join(check(structs, doc), "\n")
	for _, want := range []string{
		"demo.Options (demo/options.go) has no section",
		"`Gone` under `demo.Config`, but demo.Config has no such field",
		"row `Beta` under `demo.Config` has an empty cell",
		"a section `demo.Removed` that names no configuration struct",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("check did not report %q; it reported:\n%s", want, got)
		}
	}
	// The same document with Beta removed reports Beta as missing.
	doc = strings.Replace(doc, "| `Beta` | `string` |  | any | no default given |\n", "", 1)
	if got := strings.Join(check(structs, doc), "\n"); !strings.Contains(got, "demo.Config.Beta (demo/config.go) is not documented") {
		t.Errorf("check did not report the missing row of Beta; it reported:\n%s", got)
	}
}

func hasStruct(structs []configStruct, name string) bool {
	for _, s := range structs {
		if s.Name == name {
			return true
		}
	}
	return false
}

// moduleRoot finds the directory of the go.mod declaring modulePath, from
// the test's working directory (the package directory) upwards.
func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && declaresModule(b, modulePath) {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatalf("no go.mod declaring module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

func declaresModule(gomod []byte, path string) bool {
	sc := bufio.NewScanner(strings.NewReader(string(gomod)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == path {
			return true
		}
	}
	return false
}

// findConfigStructs parses every non-test Go file of the module's public
// packages and returns the exported struct types to document, sorted by
// name.
func findConfigStructs(root string) ([]configStruct, error) {
	var out []configStruct
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == root {
				return nil
			}
			name := d.Name()
			if strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") || skipDirs[name] {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir // another module
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil // not importable
		}
		rel, _ := filepath.Rel(root, path)
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.TYPE {
				continue
			}
			for _, spec := range gd.Specs {
				ts := spec.(*ast.TypeSpec)
				st, ok := ts.Type.(*ast.StructType)
				if !ok || !ts.Name.IsExported() {
					continue
				}
				name := f.Name.Name + "." + ts.Name.Name
				if !strings.HasSuffix(ts.Name.Name, "Config") && !strings.HasSuffix(ts.Name.Name, "Options") && !extraStructs[name] {
					continue
				}
				out = append(out, configStruct{Name: name, File: filepath.ToSlash(rel), Fields: exportedFields(st)})
			}
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, err
}

// exportedFields returns the exported field names of st; an embedded field
// is named by its type.
func exportedFields(st *ast.StructType) []string {
	var names []string
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 {
			if n := embeddedName(f.Type); n != "" && ast.IsExported(n) {
				names = append(names, n)
			}
			continue
		}
		for _, n := range f.Names {
			if n.IsExported() {
				names = append(names, n.Name)
			}
		}
	}
	return names
}

func embeddedName(e ast.Expr) string {
	switch x := e.(type) {
	case *ast.Ident:
		return x.Name
	case *ast.StarExpr:
		return embeddedName(x.X)
	case *ast.SelectorExpr:
		return x.Sel.Name
	case *ast.IndexExpr: // generic instance
		return embeddedName(x.X)
	case *ast.IndexListExpr:
		return embeddedName(x.X)
	}
	return ""
}

var (
	headingRe   = regexp.MustCompile(`^(#{1,6})\s+(.*)$`)
	structRefRe = regexp.MustCompile("`([a-z][a-z0-9]*\\.[A-Z][A-Za-z0-9]*)`")
	fieldCellRe = regexp.MustCompile("^`([A-Za-z_][A-Za-z0-9_]*)`$")
	separatorRe = regexp.MustCompile(`^\|?\s*:?-{3,}`)
)

// section is the part of the document under one heading that names a
// struct, up to the next heading of the same or a higher level.
type section struct {
	heading string
	rows    [][]string // table rows (header and separator rows excluded), cells trimmed
}

// check returns one problem per undocumented field, per documented field
// or struct that does not exist, and per row with an empty cell.
func check(structs []configStruct, doc string) []string {
	sections := map[string][]*section{} // by "pkg.Type" named in the heading
	var cur *section
	curLevel := 0
	inTable, inFence := false, false
	for _, line := range strings.Split(doc, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") {
			inFence = !inFence
			continue
		}
		if inFence {
			continue
		}
		if m := headingRe.FindStringSubmatch(trimmed); m != nil {
			level := len(m[1])
			if cur != nil && level <= curLevel {
				cur = nil
			}
			if refs := structRefRe.FindAllStringSubmatch(m[2], -1); len(refs) == 1 {
				cur, curLevel = &section{heading: refs[0][1]}, level
				sections[refs[0][1]] = append(sections[refs[0][1]], cur)
			}
			inTable = false
			continue
		}
		if !strings.HasPrefix(trimmed, "|") {
			inTable = false
			continue
		}
		if cur == nil {
			continue
		}
		if !inTable { // the header row
			inTable = true
			continue
		}
		if separatorRe.MatchString(trimmed) {
			continue
		}
		// "\|" is a pipe inside a cell, not a cell boundary.
		cells := strings.Split(strings.Trim(strings.ReplaceAll(trimmed, `\|`, "\x00"), "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(strings.ReplaceAll(cells[i], "\x00", `\|`))
		}
		cur.rows = append(cur.rows, cells)
	}

	var problems []string
	known := map[string]bool{}
	for _, s := range structs {
		known[s.Name] = true
		secs := sections[s.Name]
		switch len(secs) {
		case 0:
			problems = append(problems, fmt.Sprintf("%s (%s) has no section in %s: add a heading naming `%s` with a table row per field",
				s.Name, s.File, configDoc, s.Name))
			continue
		case 1:
		default:
			problems = append(problems, fmt.Sprintf("%s has %d sections in %s; want one", s.Name, len(secs), configDoc))
		}
		fields := map[string]bool{}
		for _, f := range s.Fields {
			fields[f] = true
		}
		documented := map[string]bool{}
		for _, sec := range secs {
			for _, row := range sec.rows {
				m := fieldCellRe.FindStringSubmatch(row[0])
				if m == nil {
					problems = append(problems, fmt.Sprintf("a row under `%s` starts with %q, not a field name in backquotes", s.Name, row[0]))
					continue
				}
				documented[m[1]] = true
				if !fields[m[1]] {
					problems = append(problems, fmt.Sprintf("%s lists `%s` under `%s`, but %s has no such field (%s)", configDoc, m[1], s.Name, s.Name, s.File))
				}
				if len(row) < 5 {
					problems = append(problems, fmt.Sprintf("row `%s` under `%s` has %d cells; want 5 (field, type, default, range and unit, meaning)", m[1], s.Name, len(row)))
					continue
				}
				for i, c := range row {
					if c == "" {
						problems = append(problems, fmt.Sprintf("row `%s` under `%s` has an empty cell (column %d); write \"none\" or \"—\" where nothing applies", m[1], s.Name, i+1))
						break
					}
				}
			}
		}
		for _, f := range s.Fields {
			if !documented[f] {
				problems = append(problems, fmt.Sprintf("%s.%s (%s) is not documented: add a row \"| `%s` | type | default | range, unit | meaning |\" under `%s` in %s",
					s.Name, f, s.File, f, s.Name, configDoc))
			}
		}
	}
	// A section naming a type of one of the checked packages that is not a
	// configuration struct (renamed, removed) is stale. Types of other
	// packages (`time.Duration`) may be named freely.
	pkgs := map[string]bool{}
	for name := range known {
		pkgs[name[:strings.IndexByte(name, '.')]] = true
	}
	var stale []string
	for name := range sections {
		if !known[name] && pkgs[name[:strings.IndexByte(name, '.')]] {
			stale = append(stale, name)
		}
	}
	sort.Strings(stale)
	for _, name := range stale {
		problems = append(problems, fmt.Sprintf("%s has a section `%s` that names no configuration struct of the code: remove or rename it", configDoc, name))
	}
	return problems
}
