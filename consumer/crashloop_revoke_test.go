package consumer

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idemq/idemq/dedup"
	"github.com/jackc/pgx/v5"
)

// A lane revoked and later assigned again (Revocable) starts a new crash-loop
// session, so that the deliveries its next owner left unfinished are
// suspects, even when the lane comes back above every offset this session
// saw and below the watermark it covered (where neither the rewind nor the
// foreign-watermark rule of the session would notice). The revoked claim's
// late deliveries are dropped before any watermark, check or marker call.
func TestCrashLoopRevokedLaneStartsNewSession(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run("batch="+strconv.Itoa(batch), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMarkerStore()
				src := &revocableSource{feed: make(chan Delivery, 16)}
				old, revoke := context.WithCancel(context.Background())
				h := func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
				stop := runRevocable(t, Config{Store: st, Handler: h, BatchSize: batch, BatchWait: time.Millisecond,
					CommitEvery: 1, CommitInterval: time.Millisecond}, src) // default Window: 1000
				defer stop()
				for off := range int64(5) {
					src.feed <- delivery(old, off)
				}
				waitFor(t, "the first claim's deliveries", func() bool {
					_, _, _, processed, _ := st.snapshot()
					return len(processed) == 5
				})
				if advances, checks, marks, _, _ := st.snapshot(); fmt.Sprint(advances) != "[1000]" || len(checks)+len(marks) != 0 {
					t.Fatalf("first deliveries: watermark writes %v, checks %v, marks %v; want [1000] and none", advances, checks, marks)
				}
				revoke() // a rebalance takes the lane
				src.feed <- delivery(old, 5)
				// The lane's next owner ran offsets 5–14 and died at 15, raising
				// the watermark; the lane comes back to this member at 15.
				st.mu.Lock()
				st.watermark["t/0"] = 1014
				st.mu.Unlock()
				next := context.Background()
				src.feed <- delivery(next, 15)
				src.feed <- delivery(next, 16)
				waitFor(t, "the next claim's deliveries", func() bool {
					_, _, _, processed, _ := st.snapshot()
					return slices.Contains(processed, "m-16")
				})
				advances, checks, marks, processed, _ := st.snapshot()
				if slices.Contains(processed, "m-5") || slices.Contains(checks, "m-5") || slices.Contains(marks, "m-5") {
					t.Fatalf("processed %v, checks %v, marks %v: the revoked claim's m-5 reached the store", processed, checks, marks)
				}
				if len(advances) != 2 || advances[1] != 1015 {
					t.Fatalf("watermark writes %v, want [1000 1015]: the new assignment reads the watermark again", advances)
				}
				// A pull session marks at most BatchSize deliveries.
				want := []string{"m-15", "m-16"}[:min(batch, 2)]
				if !slices.Equal(marks, want) || !slices.Equal(checks, want) {
					t.Fatalf("checks %v, marks %v; want %v: what the lane's last owner left unfinished is a suspect", checks, marks, want)
				}
			})
		})
	}
}

// Suspects of a revoked claim (deliveries at or below the watermark, which
// would be checked and marked) are dropped before any check or marker: in
// batched mode also those waiting behind a replay run in place.
func TestCrashLoopRevokedSuspectsAreDropped(t *testing.T) {
	for _, batch := range []int{1, 3} {
		t.Run("batch="+strconv.Itoa(batch), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				st := newMarkerStore()
				st.watermark["t/0"] = 50 // left by a process that died
				st.block = make(chan struct{})
				src := &revocableSource{feed: make(chan Delivery, 16)}
				old, revoke := context.WithCancel(context.Background())
				h := func(context.Context, pgx.Tx, *dedup.Message) error { return nil }
				stop := runRevocable(t, Config{Store: st, Handler: h, BatchSize: batch, BatchWait: 50 * time.Millisecond,
					CommitEvery: 1, CommitInterval: time.Millisecond}, src)
				defer stop()
				for off := range int64(3) {
					src.feed <- delivery(old, off)
				}
				waitFor(t, "m-0 to run", func() bool {
					_, _, _, processed, _ := st.snapshot()
					return len(processed) == 1
				})
				revoke() // a rebalance takes the lane while the marked m-0 runs
				st.mu.Lock()
				block := st.block
				st.block = nil
				st.mu.Unlock()
				block <- struct{}{}
				src.feed <- delivery(context.Background(), 3) // the lane's next claim, after its next owner ran 1–2
				waitFor(t, "the next claim's m-3", func() bool {
					_, _, _, processed, _ := st.snapshot()
					return slices.Contains(processed, "m-3")
				})
				_, checks, marks, processed, _ := st.snapshot()
				want := []string{"m-0", "m-3"}
				if !slices.Equal(checks, want) || !slices.Equal(marks, want) || !slices.Equal(processed, want) {
					t.Fatalf("checks %v, marks %v, processed %v; want each %v: the revoked m-1 and m-2 dropped, then the next claim's m-3",
						checks, marks, processed, want)
				}
			})
		})
	}
}
