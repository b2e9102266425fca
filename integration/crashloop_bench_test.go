package integration

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/idemq/idemq/consumer"
	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// BenchmarkCrashLoopOverhead measures what crash-loop bounding (lane
// watermarks and start markers, consumer.Config.CrashLoop) costs per
// message, through consumer.Handle on one lane each, against a ceiling
// measured in the same run: the handler's insert in a plain transaction.
// Markers off and on are measured in pairs, message by message alternately,
// so that load on the machine falls on both alike:
//
//   - first-delivery: a new message (claim, insert, mark, commit); markers
//     on add one watermark upsert per Window+1 (1001) offsets;
//   - replay-final: a copy of a message that already succeeded, below the
//     lane's watermark after a restart (off: Process's duplicate path; on:
//     one read, no transaction);
//   - replay-unfinished: a copy with no final record below the watermark
//     after a restart (on: the start marker's transaction, then the run,
//     whose claim finds the marker's record), against a first delivery with
//     markers off;
//   - mark-start: Store.MarkStart alone on a new identity (the extra
//     transaction).
//
// Each reports "us-off" and "us-on" (microseconds per message), "us-over-off"
// (their difference) and "x-ceiling" (us-on over the ceiling); ns/op counts
// both messages of a pair.
//
//	make bench   (or: go test -run '^$' -bench CrashLoopOverhead ./integration)
func BenchmarkCrashLoopOverhead(b *testing.B) {
	e, insert, handler := benchPayments(b)
	quiet := slog.New(slog.DiscardHandler)
	// lane is one consumer's lane: its scope and message IDs are its own.
	type lane struct {
		c   *consumer.Consumer
		run string
	}
	newLane := func(b *testing.B, restarted bool, cl consumer.CrashLoopConfig) lane {
		scope := randomName("bench-")
		if restarted { // the lane lies below its watermark, as after a crash
			if _, err := e.store.AdvanceLaneWatermark(e.ctx, scope, "bench/0", 1<<40); err != nil {
				b.Fatal(err)
			}
		}
		c, err := consumer.New(consumer.Config{Scope: scope, Store: e.store, Handler: handler, CrashLoop: cl, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		return lane{c: c, run: randomName("")}
	}
	delivery := func(run string, i int) consumer.Delivery {
		id := fmt.Sprintf("%s-%d", run, i)
		return consumer.Delivery{Message: &dedup.Message{Payload: []byte(`{"amount":100}`), Topic: "bench"},
			MessageID: id, Position: "bench:" + id, Lane: "bench/0", Offset: int64(i)}
	}
	handle := func(b *testing.B, l lane, i int, want dedup.Outcome) time.Duration {
		start := time.Now()
		res, err := l.c.Handle(e.ctx, delivery(l.run, i))
		d := time.Since(start)
		if err != nil || res.Outcome != want {
			b.Fatalf("%+v %v, want %s", res, err, want)
		}
		return d
	}
	// prefill processes deliveries 0..n-1 of l's run with a consumer of its
	// own (markers off), so that l replays them.
	prefill := func(b *testing.B, l lane, n int) {
		c, err := consumer.New(consumer.Config{Scope: l.c.Config().Scope, Store: e.store, Handler: handler,
			CrashLoop: consumer.CrashLoopConfig{Off: true}, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		for i := range n {
			if res, err := c.Handle(e.ctx, delivery(l.run, i)); err != nil || res.Outcome != dedup.OutcomeProcessed {
				b.Fatalf("%+v %v", res, err)
			}
		}
	}
	var ceiling time.Duration
	// pairs times b.N deliveries on off and on alternately.
	pairs := func(b *testing.B, off, on lane, wantOff, wantOn dedup.Outcome) {
		var tOff, tOn time.Duration
		b.ResetTimer()
		for i := range b.N {
			if i%2 == 0 {
				tOff += handle(b, off, i, wantOff)
				tOn += handle(b, on, i, wantOn)
			} else {
				tOn += handle(b, on, i, wantOn)
				tOff += handle(b, off, i, wantOff)
			}
		}
		perOff, perOn := tOff/time.Duration(b.N), tOn/time.Duration(b.N)
		b.ReportMetric(float64(perOff)/float64(time.Microsecond), "us-off")
		b.ReportMetric(float64(perOn)/float64(time.Microsecond), "us-on")
		b.ReportMetric(float64(perOn-perOff)/float64(time.Microsecond), "us-over-off")
		if ceiling > 0 {
			b.ReportMetric(float64(perOn)/float64(ceiling), "x-ceiling")
		}
	}

	b.Run("ceiling=plain-tx", func(b *testing.B) {
		run := randomName("")
		start := time.Now()
		for i := range b.N {
			id := fmt.Sprintf("plain-%s-%d", run, i)
			if err := pgx.BeginFunc(e.ctx, e.pool, func(tx pgx.Tx) error { return insert(e.ctx, tx, id) }); err != nil {
				b.Fatal(err)
			}
		}
		ceiling = time.Since(start) / time.Duration(b.N)
		b.ReportMetric(float64(ceiling)/float64(time.Microsecond), "us-on")
	})
	b.Run("first-delivery", func(b *testing.B) {
		pairs(b, newLane(b, false, consumer.CrashLoopConfig{Off: true}), newLane(b, false, consumer.CrashLoopConfig{}),
			dedup.OutcomeProcessed, dedup.OutcomeProcessed)
	})
	b.Run("replay-final", func(b *testing.B) {
		off, on := newLane(b, true, consumer.CrashLoopConfig{Off: true}), newLane(b, true, consumer.CrashLoopConfig{})
		prefill(b, off, b.N)
		prefill(b, on, b.N)
		pairs(b, off, on, dedup.OutcomeDuplicate, dedup.OutcomeDuplicate)
	})
	b.Run("replay-unfinished", func(b *testing.B) {
		// Every delivery of on is a suspect: the budget covers them all.
		pairs(b, newLane(b, false, consumer.CrashLoopConfig{Off: true}), newLane(b, true, consumer.CrashLoopConfig{InFlight: b.N}),
			dedup.OutcomeProcessed, dedup.OutcomeProcessed)
	})
	b.Run("mark-start", func(b *testing.B) {
		run := randomName("")
		start := time.Now()
		for i := range b.N {
			m := delivery(run, i)
			ident, err := dedup.NewIdentity("bench-mark", m.MessageID, m.Position, "")
			if err != nil {
				b.Fatal(err)
			}
			m.Message.Identity = ident
			if sm, err := e.store.MarkStart(e.ctx, m.Message); err != nil || !sm.Run {
				b.Fatalf("%+v %v", sm, err)
			}
		}
		per := time.Since(start) / time.Duration(b.N)
		b.ReportMetric(float64(per)/float64(time.Microsecond), "us-on")
		if ceiling > 0 {
			b.ReportMetric(float64(per)/float64(ceiling), "x-ceiling")
		}
	})
}
