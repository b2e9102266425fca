package docscheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var (
	metricLiteral = regexp.MustCompile(`"(idemq_[a-z_]+)"`)
	metricMention = regexp.MustCompile(`\bidemq_[a-z_]+\b`)
)

// TestDocsNameOnlyRealMetrics fails when the README, docs/ or deploy/ name
// an idemq_* metric that no non-test Go file of the module defines (a
// renamed or removed metric left in the docs, the alert rules or the
// dashboard). A histogram's _bucket, _sum and _count series count as its
// name; "idemq_relay_*" as any name with that prefix.
func TestDocsNameOnlyRealMetrics(t *testing.T) {
	root := moduleRoot(t)
	defined := map[string]bool{}
	err := fs.WalkDir(os.DirFS(root), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != "." && (strings.HasPrefix(d.Name(), ".") || d.Name() == "integration" || d.Name() == "examples") {
			return fs.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			return err
		}
		for _, m := range metricLiteral.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(defined) < 20 {
		t.Fatalf("%d metric names found in the code: the scanner missed them", len(defined))
	}
	docs := []string{"README.md", "deploy/prometheus/idemq-alerts.yml", "deploy/grafana/idemq-dashboard.json"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range more {
		docs = append(docs, strings.TrimPrefix(m, root+string(filepath.Separator)))
	}
	for _, doc := range docs {
		b, err := os.ReadFile(filepath.Join(root, doc))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, name := range metricMention.FindAllString(string(b), -1) {
			if seen[name] || known(defined, name) {
				continue
			}
			seen[name] = true
		}
		var missing []string
		for n := range seen {
			missing = append(missing, n)
		}
		sort.Strings(missing)
		for _, n := range missing {
			t.Errorf("%s names %s, which no collector defines", doc, n)
		}
	}
}

// known reports whether name is a defined metric, one of a histogram's
// series, or (ending in "_") a prefix of one.
func known(defined map[string]bool, name string) bool {
	if defined[name] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && defined[base] {
			return true
		}
	}
	if strings.HasSuffix(name, "_") {
		for d := range defined {
			if strings.HasPrefix(d, name) {
				return true
			}
		}
	}
	return false
}
