package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var (
	docFence    = regexp.MustCompile("(?s)```[a-z]*\n(.*?)```")
	docSpan     = regexp.MustCompile("`(idemq [^`]+)`")
	docComment  = regexp.MustCompile(`\s+#\s.*$`)
	docRedirect = regexp.MustCompile(`\s+[<>].*$`)
)

// docCommandLines returns the idemq command lines of the README and docs/:
// the lines of code blocks that start with "idemq ", and inline code spans
// that do, each with its file for the error.
func docCommandLines(t *testing.T) [][2]string {
	t.Helper()
	files := []string{"../../README.md"}
	more, err := filepath.Glob("../../docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, more...)
	var out [][2]string
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range docFence.FindAllStringSubmatch(text, -1) {
			for _, line := range strings.Split(m[1], "\n") {
				if strings.HasPrefix(strings.TrimSpace(line), "idemq ") {
					out = append(out, [2]string{filepath.Base(f), strings.TrimSpace(line)})
				}
			}
		}
		prose := docFence.ReplaceAllString(text, "")
		for _, m := range docSpan.FindAllStringSubmatch(prose, -1) {
			out = append(out, [2]string{filepath.Base(f), m[1]})
		}
	}
	return out
}

// checkDocLine returns what is wrong with one documented command line:
// an unknown command, a long flag written with one dash, or a flag the
// command does not have. "--http-…" stands for any flag of that prefix;
// "a | b" lists sibling commands; placeholders (<command>, ID…) pass.
func checkDocLine(root *cobra.Command, line string) []string {
	line = docComment.ReplaceAllString(line, "")
	line = docRedirect.ReplaceAllString(line, "")
	line = strings.NewReplacer("[", " ", "]", " ", `\|`, "|").Replace(line)
	var problems []string
	var parent *cobra.Command
	cmd := root
segments:
	for i, seg := range strings.Split(line, " | ") {
		words := strings.Fields(seg)
		switch {
		case i == 0:
			words = words[1:] // "idemq"
		case len(words) == 0:
			break segments
		case strings.HasPrefix(words[0], "-"):
			// "unpark --topic T | --all": another flag of the same command
		case parent != nil && isSub(parent, words[0]):
			cmd = parent // "stats | parked": a sibling command
		default:
			break segments // "… | jq": a shell pipe
		}
		positional := false
		for _, w := range words {
			w = strings.Trim(w, `'"`)
			switch {
			case w == "…":
				break segments // "idemq … -o json": any command
			case strings.HasPrefix(w, "<") || w == "" || w == "-":
				positional = true
			case strings.HasPrefix(w, "--"):
				name := strings.SplitN(strings.TrimPrefix(w, "--"), "=", 2)[0]
				if !hasFlag(cmd, name) {
					problems = append(problems, "`"+cmd.CommandPath()+"` has no flag --"+name)
				}
			case strings.HasPrefix(w, "-") && len(w) > 2 && w[1] != '-':
				problems = append(problems, "long flag with one dash: "+w+" (write -"+w+")")
			case strings.HasPrefix(w, "-"):
				if cmd.Flags().ShorthandLookup(w[1:]) == nil && cmd.InheritedFlags().ShorthandLookup(w[1:]) == nil {
					problems = append(problems, "`"+cmd.CommandPath()+"` has no flag "+w)
				}
			case !positional && cmd.HasSubCommands():
				sub, _, err := cmd.Find([]string{w})
				if err != nil || sub == cmd {
					problems = append(problems, "`"+cmd.CommandPath()+"` has no command "+w)
					positional = true
					continue
				}
				parent, cmd = cmd, sub
			default:
				positional = true
			}
		}
	}
	return problems
}

// isSub reports whether name is a subcommand of cmd.
func isSub(cmd *cobra.Command, name string) bool {
	for _, c := range cmd.Commands() {
		if c.Name() == name {
			return true
		}
	}
	return false
}

// notCommands are code spans that start with "idemq " but name no command
// line (a span name of the tracing).
var notCommands = map[string]bool{"idemq deliver <topic>": true}

// hasFlag reports whether cmd has the long flag name; a name ending in "…"
// matches any flag with that prefix, and one with "…" inside (--…-file)
// any flag with that suffix.
func hasFlag(cmd *cobra.Command, name string) bool {
	if name == "help" {
		return true
	}
	pre, suf, ell := strings.Cut(name, "…")
	found := false
	for _, fs := range []*pflag.FlagSet{cmd.Flags(), cmd.InheritedFlags()} {
		fs.VisitAll(func(f *pflag.Flag) {
			if f.Name == name || (ell && strings.HasPrefix(f.Name, pre) && strings.HasSuffix(f.Name, suf)) {
				found = true
			}
		})
	}
	return found
}

// TestDocsCommandLinesExist fails when the README or docs/ show an idemq
// command or flag that the CLI does not have, or a long flag with one dash.
func TestDocsCommandLinesExist(t *testing.T) {
	a := &app{stdout: os.Stdout, stderr: os.Stderr, getenv: func(string) string { return "" }}
	root := a.rootCommand()
	lines := docCommandLines(t)
	if len(lines) < 30 {
		t.Fatalf("%d idemq command lines found in the README and docs/: the scanner missed them", len(lines))
	}
	for _, l := range lines {
		if notCommands[l[1]] {
			continue
		}
		for _, p := range checkDocLine(root, l[1]) {
			t.Errorf("%s: %s\n\t%s", l[0], p, l[1])
		}
	}
}

// TestCheckDocLine: the checker itself finds each kind of mistake.
func TestCheckDocLine(t *testing.T) {
	a := &app{stdout: os.Stdout, stderr: os.Stderr, getenv: func(string) string { return "" }}
	root := a.rootCommand()
	for line, want := range map[string]string{
		"idemq migrate -schema s":                         "one dash",
		"idemq outbox list":                               "has no command list",
		"idemq inspect --scope s --no-such x":             "has no flag --no-such",
		"idemq outbox stats | parked --frob":              "has no flag --frob",
		"idemq redrive --http-… --message-id K":           "",
		"idemq <command> --help":                          "",
		"idemq dead-letters export --file - | jq -r .x":   "",
		"idemq … -o json | jq":                            "",
		"idemq outbox unpark --topic T | --all --dry-run": "",
		"idemq outbox unpark --topic T | --frob":          "has no flag --frob",
		"idemq inspect -o table --scope s":                "",
	} {
		got := strings.Join(checkDocLine(root, line), "; ")
		if (want == "") != (got == "") || !strings.Contains(got, want) {
			t.Errorf("checkDocLine(%q) = %q, want %q", line, got, want)
		}
	}
}
