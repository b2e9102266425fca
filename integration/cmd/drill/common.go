package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// repoRoot is the checkout this program was built from (go run keeps the
// source path): the topology scripts live there.
func repoRoot() (string, error) {
	if r := os.Getenv("IDEMQ_REPO"); r != "" {
		return r, nil
	}
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", fmt.Errorf("cannot tell where the checkout is: set IDEMQ_REPO")
	}
	return filepath.Abs(filepath.Join(filepath.Dir(file), "..", "..", ".."))
}

// topology runs scripts/topology/<name>.sh with args, its output on stderr.
func topology(ctx context.Context, name string, args ...string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(root, "scripts", "topology", name+".sh")}, args...)...) // #nosec G204 -- our own script
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("scripts/topology/%s.sh %s: %w", name, strings.Join(args, " "), err)
	}
	return nil
}

// env is the environment variable, or def.
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// suffix makes names unique per run: time and 3 random bytes.
func suffix() string {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return time.Now().Format("150405") + hex.EncodeToString(b)
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// logf prints a progress line on stderr.
func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "   "+format+"\n", args...)
}

// table prints a summary: one row per figure, one column per run.
type table struct {
	title   string
	columns []string
	rows    [][]string
}

func (t *table) row(label string, cells ...string) {
	t.rows = append(t.rows, append([]string{label}, cells...))
}

func (t *table) print() {
	fmt.Printf("\n%s\n\n", t.title)
	w := 0
	for _, r := range t.rows {
		w = max(w, len(r[0]))
	}
	cw := make([]int, len(t.columns)) // each column as wide as its widest cell
	for i, c := range t.columns {
		cw[i] = max(12, len(c))
		for _, r := range t.rows {
			if i+1 < len(r) {
				cw[i] = max(cw[i], len(r[i+1]))
			}
		}
	}
	fmt.Printf("%-*s", w, "")
	for i, c := range t.columns {
		fmt.Printf("  %*s", cw[i], c)
	}
	fmt.Println()
	for _, r := range t.rows {
		fmt.Printf("%-*s", w, r[0])
		for i, c := range r[1:] {
			fmt.Printf("  %*s", cw[i], c)
		}
		fmt.Println()
	}
}
