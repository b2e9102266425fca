package main

import (
	"fmt"
	"io"
	"time"
)

// progress prints "purge: N rows deleted, R rows/s" to w at most every
// interval (the purges' progress line on stderr).
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
