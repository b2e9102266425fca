package main

import (
	"log/slog"

	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/idemq/idemq/outbox"
	"github.com/jackc/pgx/v5/pgxpool"
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

// drillSetup is what the drills that consume and relay need on one schema:
// the fingerprinter, the store (migrated) and the outbox (migrated).
type drillSetup struct {
	fp    *dedup.Fingerprinter
	store *pgstore.Store
	ob    *outbox.Outbox
}

// setupStoreOutbox builds and migrates a store (MaxAttempts maxAttempts)
// and an outbox on schema, with a fingerprint secret named after the drill.
func setupStoreOutbox(ctx context.Context, pool *pgxpool.Pool, drill, schema string, maxAttempts int, logger *slog.Logger) (drillSetup, error) {
	var d drillSetup
	var err error
	if d.fp, err = dedup.NewFingerprinter(nil, dedup.FingerprintKey{ID: "drill", Secret: []byte(drill + "-drill-secret-0123456789")}); err != nil {
		return d, err
	}
	if d.store, err = pgstore.New(pool, pgstore.Config{Schema: schema, Fingerprinter: d.fp, MaxAttempts: maxAttempts, Logger: logger}); err != nil {
		return d, err
	}
	if d.ob, err = outbox.New(pool, outbox.Config{Schema: schema}); err != nil {
		return d, err
	}
	if err := d.store.Migrate(ctx); err != nil {
		return d, err
	}
	return d, d.ob.Migrate(ctx)
}
