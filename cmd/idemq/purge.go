package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/idemq/idemq/dedup/pgstore"
)

// runPurge is `idemq purge`: expired records, or with -dead-letters the
// dead letters older than -older-than, with a progress line on stderr. An
// interrupted purge (SIGINT/SIGTERM) reports what it deleted and fails.
func runPurge(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("purge", flag.ContinueOnError)
	var f storeFlags
	f.register(fs)
	batch := fs.Int("batch", pgstore.DefaultPurgeBatch, "rows read per statement (the expired ones among them are deleted); 1 to 100000")
	deadLetters := fs.Bool("dead-letters", false, "purge dead letters older than -older-than (with their re-drive audit rows) instead of expired records")
	olderThan := fs.Duration("older-than", pgstore.DefaultDeadLetterRetention, "with -dead-letters: delete dead letters created longer ago than this (at least 1m)")
	every := fs.Duration("progress", time.Second, "print the rows deleted so far and the rate on stderr at most this often (0: after every statement that deleted rows)")
	if err := parse(fs, args, nil); err != nil {
		return err
	}
	if err := f.postgresOnly("purge"); err != nil {
		return err
	}
	pool, st, err := f.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	p := newProgress(os.Stderr, *every)
	o := pgstore.PurgeOptions{Batch: *batch, OlderThan: *olderThan, Progress: p.step}
	what := "expired records"
	var n int64
	if *deadLetters {
		what = fmt.Sprintf("dead letters older than %s", *olderThan)
		n, err = st.PurgeDeadLetters(ctx, o)
	} else {
		n, err = st.PurgeRecords(ctx, o)
	}
	if err != nil {
		if ctx.Err() != nil { // SIGINT/SIGTERM: the statement in flight rolled back
			return fmt.Errorf("purge interrupted: %d %s deleted before it stopped (%s)", n, what, p.rate(n))
		}
		return fmt.Errorf("purge failed after deleting %d %s: %w", n, what, err)
	}
	fmt.Printf("purged %d %s (%s)\n", n, what, p.rate(n))
	return nil
}

// progress prints "purge: N rows deleted, R rows/s" to w at most every
// interval.
type progress struct {
	w           io.Writer
	every       time.Duration
	start, last time.Time
}

func newProgress(w io.Writer, every time.Duration) *progress {
	now := time.Now()
	return &progress{w: w, every: every, start: now, last: now}
}

func (p *progress) step(total int64) {
	now := time.Now()
	if now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	_, _ = fmt.Fprintf(p.w, "purge: %d rows deleted, %s\n", total, p.rate(total))
}

func (p *progress) rate(total int64) string {
	secs := time.Since(p.start).Seconds()
	if secs <= 0 {
		return "0 rows/s"
	}
	return fmt.Sprintf("%.0f rows/s over %s", float64(total)/secs, time.Since(p.start).Round(time.Millisecond))
}
