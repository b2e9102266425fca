package docscheck

import (
	"io/fs"
	"os"
	"regexp"
	"strings"
	"testing"
)

// snippetDocs are the documents whose Go code blocks must compile: each
// block must appear, ignoring white space, in an example_*_test.go file of
// the module, where `go test ./...` compiles it (and runs it when it has an
// Output comment).
var snippetDocs = []string{"README.md", "docs/operations.md"}

var goBlock = regexp.MustCompile("(?s)```go\n(.*?)```")

// squeeze removes all white space, so that indentation and line breaks of a
// snippet may differ from its example's.
func squeeze(s string) string {
	return strings.Map(func(r rune) rune {
		if r == ' ' || r == '\t' || r == '\n' || r == '\r' {
			return -1
		}
		return r
	}, s)
}

// TestDocSnippetsCompile fails when a Go code block of a document is not
// found in any Example test file: copy the block from the example that
// compiles it (or add one).
func TestDocSnippetsCompile(t *testing.T) {
	root := moduleRoot(t)
	var examples []string
	fsys := os.DirFS(root)
	err := fs.WalkDir(fsys, ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "integration" || d.Name() == "tools") {
				return fs.SkipDir
			}
			return nil
		}
		if strings.HasPrefix(d.Name(), "example") && strings.HasSuffix(d.Name(), "_test.go") {
			b, err := fs.ReadFile(fsys, path)
			if err != nil {
				return err
			}
			examples = append(examples, squeeze(string(b)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, doc := range snippetDocs {
		b, err := fs.ReadFile(fsys, doc)
		if err != nil {
			t.Fatal(err)
		}
		for i, m := range goBlock.FindAllStringSubmatch(string(b), -1) {
			want := squeeze(m[1])
			found := false
			for _, ex := range examples {
				if strings.Contains(ex, want) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: Go block %d is in no example_*_test.go file, so nothing compiles it:\n%s", doc, i+1, m[1])
			}
		}
	}
}
