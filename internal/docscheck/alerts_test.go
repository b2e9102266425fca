package docscheck

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// shippedRule is one rule of deploy/prometheus/idemq-alerts.yml.
type shippedRule struct{ alert, expr, forDur string }

var (
	ruleAlert = regexp.MustCompile(`^\s*- alert: (\S+)\s*$`)
	ruleField = regexp.MustCompile(`^\s*(expr|for): (.+?)\s*$`)
	// A row of the shipped-rules table: | `Name` | `expr` | for | means |.
	docRuleRow = regexp.MustCompile("^\\| `(Idemq[A-Za-z]+)` \\| `(.+?)` \\| ([0-9]+[smhd]) \\| .+ \\|$")
)

// parseRules reads the alert rules of the shipped file. The file is flat
// YAML written by us (one "- alert:" line, then "expr:" and "for:" lines),
// so a line reader is enough and needs no YAML dependency in this module.
func parseRules(t *testing.T, b []byte) []shippedRule {
	t.Helper()
	var rules []shippedRule
	for _, line := range strings.Split(string(b), "\n") {
		if m := ruleAlert.FindStringSubmatch(line); m != nil {
			rules = append(rules, shippedRule{alert: m[1]})
			continue
		}
		if m := ruleField.FindStringSubmatch(line); m != nil && len(rules) > 0 {
			r := &rules[len(rules)-1]
			if m[1] == "expr" {
				r.expr = m[2]
			} else {
				r.forDur = m[2]
			}
		}
	}
	for _, r := range rules {
		if r.expr == "" || r.forDur == "" || strings.HasPrefix(r.expr, "|") || strings.HasPrefix(r.expr, ">") {
			t.Fatalf("rule %s: want a one-line expr and a for (the parser reads no block scalars): %+v", r.alert, r)
		}
	}
	return rules
}

// TestAlertTableMatchesShippedRules fails when docs/operations.md's table
// of shipped alert rules and deploy/prometheus/idemq-alerts.yml disagree:
// a rule missing from either, or another expression or duration.
func TestAlertTableMatchesShippedRules(t *testing.T) {
	root := moduleRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "deploy", "prometheus", "idemq-alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	rules := parseRules(t, b)
	if len(rules) < 5 {
		t.Fatalf("%d rules parsed from idemq-alerts.yml: the parser missed them", len(rules))
	}
	doc, err := os.ReadFile(filepath.Join(root, "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]shippedRule{}
	for _, line := range strings.Split(string(doc), "\n") {
		if m := docRuleRow.FindStringSubmatch(line); m != nil {
			documented[m[1]] = shippedRule{alert: m[1], expr: strings.ReplaceAll(m[2], `\|`, "|"), forDur: m[3]}
		}
	}
	for _, r := range rules {
		d, ok := documented[r.alert]
		switch {
		case !ok:
			t.Errorf("docs/operations.md: no row for the shipped alert %s", r.alert)
		case d.expr != r.expr:
			t.Errorf("docs/operations.md: alert %s:\n doc expr  %s\n file expr %s", r.alert, d.expr, r.expr)
		case d.forDur != r.forDur:
			t.Errorf("docs/operations.md: alert %s: doc says for %s, the file %s", r.alert, d.forDur, r.forDur)
		}
		delete(documented, r.alert)
	}
	for name := range documented {
		t.Errorf("docs/operations.md: alert %s is not in deploy/prometheus/idemq-alerts.yml", name)
	}
}
