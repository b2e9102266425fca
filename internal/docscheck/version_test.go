package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	readmeGoGet    = regexp.MustCompile("`go get github.com/idemq/idemq@([^`]+)`")
	changelogEntry = regexp.MustCompile(`(?m)^## \[([^\]]+)\]`)
)

// TestReadmeNamesTheVersionItDescribes fails when the README tells a
// newcomer to `go get` a tag that lacks what the README documents: while the
// CHANGELOG's [Unreleased] section has entries, the README must point at
// @main; once they are released, at the newest tag.
func TestReadmeNamesTheVersionItDescribes(t *testing.T) {
	root := moduleRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	changelog, err := os.ReadFile(filepath.Join(root, "CHANGELOG.md"))
	if err != nil {
		t.Fatal(err)
	}
	m := readmeGoGet.FindStringSubmatch(string(readme))
	if m == nil {
		t.Fatal("README.md: no `go get github.com/idemq/idemq@…` line")
	}
	entries := changelogEntry.FindAllStringSubmatchIndex(string(changelog), -1)
	if len(entries) < 2 {
		t.Fatal("CHANGELOG.md: want an [Unreleased] section and at least one release")
	}
	name := string(changelog[entries[0][2]:entries[0][3]])
	unreleased := strings.TrimSpace(string(changelog[entries[0][1]:entries[1][0]]))
	newest := string(changelog[entries[1][2]:entries[1][3]])
	switch {
	case name != "Unreleased":
		t.Fatalf("CHANGELOG.md: first section is [%s], want [Unreleased]", name)
	case unreleased != "" && m[1] != "main":
		t.Errorf("README.md says go get @%s, but CHANGELOG.md's [Unreleased] has entries that tag lacks: say @main (or cut the release)", m[1])
	case unreleased == "" && m[1] != "v"+newest:
		t.Errorf("README.md says go get @%s, but the newest release is %s", m[1], newest)
	}
}
