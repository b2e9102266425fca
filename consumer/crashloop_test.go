package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/idemq/idemq/dedup/pgstore"
	"github.com/jackc/pgx/v5"
)

// markerStore is a fake TxStore and StartMarker for the crash-loop logic of
// the runtime (the real one is tested against Postgres in integration/). It
// records each call by message ID; "done-*" message IDs have a final record.
type markerStore struct {
	mu         sync.Mutex
	watermark  map[string]int64
	advances   []int64
	checks     []string
	marks      []string
	clears     int
	processed  []string
	mark       dedup.StartMark // MarkStart's answer (default: Run)
	processErr error
	block      chan struct{} // when set, Process waits for it
	running    int
	maxRunning int
}

func newMarkerStore() *markerStore {
	return &markerStore{watermark: map[string]int64{}, mark: dedup.StartMark{Run: true}}
}

func (f *markerStore) AdvanceLaneWatermark(_ context.Context, _, lane string, to int64) (int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	prev, ok := f.watermark[lane]
	if !ok {
		prev = -1
	}
	f.watermark[lane] = max(prev, to)
	f.advances = append(f.advances, to)
	return prev, nil
}

func (f *markerStore) CheckReplay(_ context.Context, msg *dedup.Message) (dedup.Result, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.checks = append(f.checks, msg.Identity.MessageID)
	if strings.HasPrefix(msg.Identity.MessageID, "done-") {
		return dedup.Result{Outcome: dedup.OutcomeDuplicate, Status: dedup.StatusSucceeded, Attempts: 1}, true, nil
	}
	return dedup.Result{}, false, nil
}

func (f *markerStore) MarkStart(_ context.Context, msg *dedup.Message) (dedup.StartMark, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marks = append(f.marks, msg.Identity.MessageID)
	return f.mark, nil
}

func (f *markerStore) ClearStart(context.Context, dedup.StartMark) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.clears++
	return nil
}

func (f *markerStore) Process(_ context.Context, msg *dedup.Message, _ pgstore.Handler) (dedup.Result, error) {
	f.mu.Lock()
	f.processed = append(f.processed, msg.Identity.MessageID)
	f.running++
	f.maxRunning = max(f.maxRunning, f.running)
	block := f.block
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.running--
	if f.processErr != nil {
		return dedup.Result{}, f.processErr
	}
	return dedup.Result{Outcome: dedup.OutcomeProcessed, Status: dedup.StatusSucceeded, Attempts: 1, HandlerCalled: true}, nil
}

func (f *markerStore) ProcessBatch(ctx context.Context, msgs []*dedup.Message, h pgstore.Handler) ([]dedup.Result, error) {
	out := make([]dedup.Result, len(msgs))
	for i, m := range msgs {
		out[i], _ = f.Process(ctx, m, h)
	}
	return out, nil
}

func (f *markerStore) ProcessLeased(context.Context, *dedup.Message, dedup.LeaseHandler, dedup.LeaseOptions) (dedup.Result, error) {
	return dedup.Result{}, errors.New("not in these tests")
}

func (f *markerStore) Reject(context.Context, *dedup.Message, string, error) (dedup.Result, error) {
	return dedup.Result{Outcome: dedup.OutcomeDeadLetter}, nil
}
func (f *markerStore) ValidateRetention(time.Duration) error { return nil }
func (f *markerStore) MaxAttempts() int                      { return 5 }
func (f *markerStore) SucceededRetention() time.Duration     { return 7 * 24 * time.Hour }

func (f *markerStore) snapshot() (advances []int64, checks, marks, processed []string, clears int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int64(nil), f.advances...), append([]string(nil), f.checks...), append([]string(nil), f.marks...),
		append([]string(nil), f.processed...), f.clears
}

func markerConsumer(t *testing.T, st *markerStore, cfg Config) *Consumer {
	t.Helper()
	cfg.Scope, cfg.Store = "s", st
	if cfg.Handler == nil && cfg.LeaseHandler == nil {
		cfg.Handler = func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// laneDelivery is the delivery at off of lane t/0; its message ID is id.
func laneDelivery(id string, off int64) Delivery {
	return Delivery{Message: &dedup.Message{Payload: []byte("x")}, MessageID: id, Position: fmt.Sprintf("t/0/%d", off), Lane: "t/0", Offset: off}
}

// First deliveries cost one watermark write per Window+1 offsets and nothing
// else.
func TestCrashLoopFirstDeliveriesWriteOncePerWindow(t *testing.T) {
	st := newMarkerStore()
	c := markerConsumer(t, st, Config{CrashLoop: CrashLoopConfig{Window: 10}})
	sess := c.guard.pullSession("t/0")
	for off := range int64(100) {
		sess.received(context.Background(), off)
		if _, err := c.handle(context.Background(), laneDelivery(fmt.Sprint("m-", off), off), sess); err != nil {
			t.Fatal(err)
		}
	}
	advances, checks, marks, processed, _ := st.snapshot()
	want := []int64{10, 21, 32, 43, 54, 65, 76, 87, 98, 109} // at offsets 0, 11, 22, …, 99
	if fmt.Sprint(advances) != fmt.Sprint(want) || len(checks) != 0 || len(marks) != 0 || len(processed) != 100 {
		t.Fatalf("watermark writes %v (want %v), %d checks, %d marks, %d processed; want no check or mark", advances, want, len(checks), len(marks), len(processed))
	}
}

// After a restart below the watermark: final deliveries are answered by the
// check alone; the first InFlight deliveries without a final record are
// marked; later ones run as first deliveries.
func TestCrashLoopReplayMarksOnlyTheInFlightBudget(t *testing.T) {
	for _, inFlight := range []int{1, 3} {
		t.Run(fmt.Sprint("in-flight-", inFlight), func(t *testing.T) {
			st := newMarkerStore()
			st.watermark["t/0"] = 50 // left by the process that died
			c := markerConsumer(t, st, Config{BatchSize: inFlight, CrashLoop: CrashLoopConfig{Window: 10}})
			sess := c.guard.pullSession("t/0")
			var outcomes []dedup.Outcome
			for off := range int64(21) {
				id := fmt.Sprint("m-", off)
				if off < 10 {
					id = fmt.Sprint("done-", off)
				}
				sess.received(context.Background(), off)
				res, err := c.handle(context.Background(), laneDelivery(id, off), sess)
				if err != nil {
					t.Fatal(err)
				}
				outcomes = append(outcomes, res.Outcome)
			}
			_, checks, marks, processed, _ := st.snapshot()
			if len(checks) != 10+inFlight || len(marks) != inFlight || marks[0] != "m-10" || len(processed) != 11 {
				t.Fatalf("checks %v, marks %v, processed %v; want checks of offsets 0–%d, marks of the first %d unfinished, 11 processed",
					checks, marks, processed, 9+inFlight, inFlight)
			}
			for off, o := range outcomes {
				if want := map[bool]dedup.Outcome{true: dedup.OutcomeDuplicate, false: dedup.OutcomeProcessed}[off < 10]; o != want {
					t.Fatalf("offset %d: %s, want %s", off, o, want)
				}
			}
		})
	}
}

// A lane handed back from an older offset (a rebalance) starts a new
// session: the watermark is read again, and its unfinished deliveries may be
// marked again. A watermark raised by another process meanwhile makes the
// deliveries below it suspects too.
func TestCrashLoopRewindAndForeignWatermark(t *testing.T) {
	st := newMarkerStore()
	c := markerConsumer(t, st, Config{CrashLoop: CrashLoopConfig{Window: 10}})
	sess := c.guard.pullSession("t/0")
	run := func(off int64) {
		t.Helper()
		sess.received(context.Background(), off)
		if _, err := c.handle(context.Background(), laneDelivery(fmt.Sprint("m-", off), off), sess); err != nil {
			t.Fatal(err)
		}
	}
	for off := range int64(5) {
		run(off) // first deliveries; watermark 10
	}
	run(3) // rewind: new session, watermark 10 read back: 3 is a suspect
	if _, _, marks, _, _ := st.snapshot(); fmt.Sprint(marks) != "[m-3]" {
		t.Fatalf("marks after a rewind = %v, want [m-3]", marks)
	}
	run(4) // budget spent: a first delivery
	st.mu.Lock()
	st.watermark["t/0"] = 40 // another process ran the lane up to there
	st.mu.Unlock()
	run(14) // above what this session wrote (13): writes, finds 40
	run(15)
	if _, _, marks, _, _ := st.snapshot(); fmt.Sprint(marks) != "[m-3 m-14]" {
		t.Fatalf("marks = %v, want [m-3 m-14]: m-14 lies below a watermark this session did not write", marks)
	}
}

// Marked runs take turns process-wide, so a death is charged to one run.
func TestCrashLoopMarkedRunsOneAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		st := newMarkerStore()
		st.block = make(chan struct{})
		for lane := range 3 {
			st.watermark[fmt.Sprint("t/", lane)] = 100
		}
		c := markerConsumer(t, st, Config{CrashLoop: CrashLoopConfig{InFlight: 5}})
		var wg sync.WaitGroup
		for lane := range 3 {
			for off := range int64(2) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					d := laneDelivery(fmt.Sprintf("m-%d-%d", lane, off), off)
					d.Lane = fmt.Sprint("t/", lane)
					if _, err := c.Handle(context.Background(), d); err != nil {
						t.Error(err)
					}
				}()
			}
		}
		for done := 0; done < 6; done++ {
			synctest.Wait() // every run that can start has started and blocks
			st.mu.Lock()
			started := len(st.processed)
			st.mu.Unlock()
			if started != done+1 {
				t.Fatalf("%d marked runs started after %d finished, want %d: marked runs go one at a time", started, done, done+1)
			}
			st.block <- struct{}{}
		}
		wg.Wait()
		if _, _, marks, processed, _ := st.snapshot(); len(marks) != 6 || len(processed) != 6 || st.maxRunning != 1 {
			t.Fatalf("%d marks, %d runs, at most %d at once; want 6, 6, 1", len(marks), len(processed), st.maxRunning)
		}
	})
}

// A marker that finds the attempts used up returns its dead letter and the
// handler does not run; a marked run that returns an error withdraws its
// marker (the process did not die), one that reaches an outcome does not.
func TestCrashLoopMarkerOutcomes(t *testing.T) {
	st := newMarkerStore()
	st.watermark["t/0"] = 100
	dl := dedup.Result{Outcome: dedup.OutcomeDeadLetter, Status: dedup.StatusFailedFinal, Attempts: 3, Err: dedup.ErrExecutionLost}
	st.mark = dedup.StartMark{Result: dl}
	c := markerConsumer(t, st, Config{CrashLoop: CrashLoopConfig{InFlight: 10}})
	res, err := c.Handle(context.Background(), laneDelivery("m-1", 1))
	if _, _, _, processed, _ := st.snapshot(); err != nil || res.Outcome != dedup.OutcomeDeadLetter || len(processed) != 0 {
		t.Fatalf("exhausted marker: %+v %v, %d runs; want the dead letter and no run", res, err, len(processed))
	}
	st.mark = dedup.StartMark{Run: true}
	st.processErr = errors.New("database unreachable")
	if _, err := c.Handle(context.Background(), laneDelivery("m-2", 2)); err == nil {
		t.Fatal("Process error not returned")
	}
	st.processErr = nil
	if _, err := c.Handle(context.Background(), laneDelivery("m-3", 3)); err != nil {
		t.Fatal(err)
	}
	if _, _, marks, _, clears := st.snapshot(); len(marks) != 3 || clears != 1 {
		t.Fatalf("%d marks, %d withdrawn; want 3 and 1 (the run that returned an error)", len(marks), clears)
	}
}

// Batched mode runs the suspects at the front of a batch one at a time, then
// the rest as a batch.
func TestCrashLoopBatchRunsReplaysAlone(t *testing.T) {
	st := newMarkerStore()
	st.watermark["t/0"] = 12
	c := markerConsumer(t, st, Config{BatchSize: 10, CrashLoop: CrashLoopConfig{Window: 10}})
	sess := c.guard.pullSession("t/0")
	var pending []Delivery
	for off := range int64(15) {
		id := fmt.Sprint("m-", off)
		if off < 5 {
			id = fmt.Sprint("done-", off)
		}
		pending = append(pending, laneDelivery(id, off))
	}
	com := newCommitter(&fakeSource{}, 1000, time.Hour, slog.Default())
	n, err := c.runReplays(context.Background(), context.Background(), pending, com, sess)
	if err != nil || n != 13 {
		t.Fatalf("runReplays = %d, %v; want 13 (offsets 0–12, at or below the watermark)", n, err)
	}
	if _, checks, marks, processed, _ := st.snapshot(); len(checks) != 13 || len(marks) != 8 || len(processed) != 8 {
		t.Fatalf("%d checks, %d marks, %d runs; want 13, 8, 8", len(checks), len(marks), len(processed))
	}
	if got := st.watermark["t/0"]; got < 14 {
		t.Fatalf("watermark %d does not cover the rest of the batch (offset 14)", got)
	}
}

// The guard applies to atomic modes with a StartMarker store, unless turned
// off; CrashLoop fields are validated.
func TestCrashLoopConfig(t *testing.T) {
	st := newMarkerStore()
	if c := markerConsumer(t, st, Config{}); c.guard == nil || c.Config().CrashLoop.Window != DefaultCrashLoopWindow || c.Config().CrashLoop.InFlight != 1 {
		t.Fatalf("default: guard %v, config %+v", c.guard, c.Config().CrashLoop)
	}
	if c := markerConsumer(t, st, Config{CrashLoop: CrashLoopConfig{Off: true}}); c.guard != nil {
		t.Fatal("guard on with CrashLoop.Off")
	}
	lease := func(context.Context, *dedup.Message) error { return nil }
	if c := markerConsumer(t, st, Config{LeaseHandler: lease}); c.guard != nil {
		t.Fatal("guard on in lease mode")
	}
	for _, cl := range []CrashLoopConfig{{Window: -1}, {Window: 2_000_000_000}, {InFlight: -1}} {
		_, err := New(Config{Scope: "s", Store: st, Handler: func(context.Context, pgx.Tx, *dedup.Message) error { return nil }, CrashLoop: cl})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "CrashLoop.") {
			t.Errorf("CrashLoop %+v: %v; want an ErrInvalidConfig naming the field", cl, err)
		}
	}
}
