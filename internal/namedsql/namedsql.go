// Package namedsql loads the named SQL statements of a store from embedded
// .sql files and fills in their table names once per store.
//
// A file holds blocks, each opened by a line "-- name: <name>" (a statement
// the store runs) or "-- fragment: <name>" (a piece of SQL that statements
// include with {{template "<name>" .}}). Names are lowercase identifiers
// ([a-z][a-z0-9_]*), unique across all the files of one Set. Whole-line "--"
// comments inside a block are dropped, and so is a trailing ";". The text is
// a text/template: {{.records}} and the like are filled from the store's
// data (already quoted identifiers; text/template escapes nothing), and a
// key missing from the data is an error.
//
// Set.Bind fills a store's statement fields by name and fails when a
// statement the store asks for is missing, or a statement or fragment of the
// files is used by nothing: the statements and the code that runs them
// cannot drift apart unnoticed.
package namedsql

import (
	"bufio"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strings"
	"text/template"
	"text/template/parse"
)

// Set is the parsed statements and fragments of one store's files. It is
// read-only after Parse and safe for concurrent use.
type Set struct {
	root       *template.Template
	statements map[string]bool // name -> true (fragments are not here)
	fragments  map[string]bool
}

var (
	header = regexp.MustCompile(`^--\s*(name|fragment):\s*(\S*)\s*$`)
	nameRe = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// ParseFS parses the files of fsys that match glob (path.Match syntax, e.g.
// "sql/*.sql"), in name order, as one Set. It fails on a file without
// blocks, text before a file's first block, a bad or duplicated name, an
// empty block, or a template that does not parse.
func ParseFS(fsys fs.FS, glob string) (*Set, error) {
	files, err := fs.Glob(fsys, glob)
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("namedsql: no file matches %q", glob)
	}
	sort.Strings(files)
	s := newSet()
	for _, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		if err := s.add(f, string(b)); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// MustParseFS is ParseFS for package initialization: it panics on an error.
func MustParseFS(fsys fs.FS, glob string) *Set {
	s, err := ParseFS(fsys, glob)
	if err != nil {
		panic(err)
	}
	return s
}

// Parse parses one file's text (file names it in errors).
func Parse(file, src string) (*Set, error) {
	s := newSet()
	if err := s.add(file, src); err != nil {
		return nil, err
	}
	return s, nil
}

func newSet() *Set {
	return &Set{
		root:       template.New("").Option("missingkey=error"),
		statements: map[string]bool{},
		fragments:  map[string]bool{},
	}
}

type block struct {
	kind, name string
	line       int
	body       strings.Builder
}

func (s *Set) add(file, src string) error {
	var blocks []*block
	sc := bufio.NewScanner(strings.NewReader(src))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if m := header.FindStringSubmatch(trimmed); m != nil {
			blocks = append(blocks, &block{kind: m[1], name: m[2], line: n})
			continue
		}
		if trimmed == "" || strings.HasPrefix(trimmed, "--") {
			continue
		}
		if len(blocks) == 0 {
			return fmt.Errorf("namedsql: %s:%d: SQL before the first \"-- name:\" line", file, n)
		}
		b := blocks[len(blocks)-1]
		b.body.WriteString(strings.TrimRight(line, " \t"))
		b.body.WriteByte('\n')
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("namedsql: %s: %w", file, err)
	}
	if len(blocks) == 0 {
		return fmt.Errorf("namedsql: %s: no \"-- name:\" block", file)
	}
	for _, b := range blocks {
		switch {
		case !nameRe.MatchString(b.name):
			return fmt.Errorf("namedsql: %s:%d: name %q must match %s", file, b.line, b.name, nameRe)
		case s.statements[b.name] || s.fragments[b.name]:
			return fmt.Errorf("namedsql: %s:%d: %q is defined twice", file, b.line, b.name)
		}
		body := strings.TrimSuffix(strings.TrimSpace(b.body.String()), ";")
		if body == "" {
			return fmt.Errorf("namedsql: %s:%d: %q has no SQL", file, b.line, b.name)
		}
		if _, err := s.root.New(b.name).Parse(body); err != nil {
			return fmt.Errorf("namedsql: %s:%d: %q: %w", file, b.line, b.name, err)
		}
		if b.kind == "fragment" {
			s.fragments[b.name] = true
		} else {
			s.statements[b.name] = true
		}
	}
	return nil
}

// Names returns the statement names of the Set (fragments excluded), sorted.
func (s *Set) Names() []string {
	out := make([]string, 0, len(s.statements))
	for n := range s.statements {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Bind executes each statement named in dst with data and stores its text
// in the string dst points to. It fails when dst names a statement the Set
// does not have (or a fragment), when a statement or fragment of the Set is
// used by neither dst nor another statement, or when a statement refers to
// a key data lacks.
func (s *Set) Bind(data any, dst map[string]*string) error {
	var missing, unused []string
	for name := range dst {
		if !s.statements[name] {
			missing = append(missing, name)
		}
	}
	used := map[string]bool{}
	for name := range dst {
		if s.statements[name] {
			s.markUsed(name, used)
		}
	}
	for name := range s.statements {
		if dst[name] == nil {
			unused = append(unused, name)
		}
	}
	for name := range s.fragments {
		if !used[name] {
			unused = append(unused, name+" (fragment)")
		}
	}
	sort.Strings(missing)
	sort.Strings(unused)
	switch {
	case len(missing) > 0:
		return fmt.Errorf("namedsql: no statement named %s in the .sql files", strings.Join(missing, ", "))
	case len(unused) > 0:
		return fmt.Errorf("namedsql: statements used by no code: %s", strings.Join(unused, ", "))
	}
	for name, p := range dst {
		var b strings.Builder
		if err := s.root.ExecuteTemplate(&b, name, data); err != nil {
			return fmt.Errorf("namedsql: %s: %w", name, err)
		}
		*p = b.String()
	}
	return nil
}

// markUsed marks name and every template it includes, transitively.
func (s *Set) markUsed(name string, used map[string]bool) {
	if used[name] {
		return
	}
	used[name] = true
	t := s.root.Lookup(name)
	if t == nil || t.Tree == nil {
		return
	}
	walk(t.Root, func(ref string) { s.markUsed(ref, used) })
}

// walk calls ref for each {{template "x"}} under n.
func walk(n parse.Node, ref func(string)) {
	switch n := n.(type) {
	case *parse.ListNode:
		if n == nil {
			return
		}
		for _, c := range n.Nodes {
			walk(c, ref)
		}
	case *parse.TemplateNode:
		ref(n.Name)
	case *parse.IfNode:
		walk(n.List, ref)
		walk(n.ElseList, ref)
	case *parse.RangeNode:
		walk(n.List, ref)
		walk(n.ElseList, ref)
	case *parse.WithNode:
		walk(n.List, ref)
		walk(n.ElseList, ref)
	}
}
