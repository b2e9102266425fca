package pgstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup"
)

// fakeFastPath fails every call with err.
type fakeFastPath struct{ err error }

func (f fakeFastPath) Lookup(context.Context, dedup.Identity) (dedup.FastPathEntry, bool, error) {
	return dedup.FastPathEntry{}, false, f.err
}
func (f fakeFastPath) Remember(context.Context, dedup.Identity, dedup.FastPathEntry) error {
	return f.err
}

// A skipped fast-path call (an open circuit breaker) falls through to
// Postgres and is counted as an error like any other, but is not logged:
// an outage must not log once per message.
func TestFastPathSkipIsCountedNotLogged(t *testing.T) {
	for _, c := range []struct {
		err  error
		logs int
	}{
		{fmt.Errorf("breaker open: %w", dedup.ErrFastPathSkipped), 0},
		{errors.New("dial tcp: connection refused"), 2},
	} {
		var buf bytes.Buffer
		s := &Store{cfg: Config{FastPath: fakeFastPath{c.err}, Logger: slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))}}
		id, err := dedup.NewIdentity("payments", "m-1", "", "")
		if err != nil {
			t.Fatal(err)
		}
		if _, hit := s.fastLookup(context.Background(), &dedup.Message{Identity: id}); hit {
			t.Fatal("hit on an error")
		}
		s.fastRemember(context.Background(), id, []byte{1}, "k1")
		if _, _, errs := s.FastPathStats(); errs != 2 {
			t.Fatalf("%v: %d errors counted, want 2", c.err, errs)
		}
		if n := strings.Count(buf.String(), "\n"); n != c.logs {
			t.Fatalf("%v: %d log lines, want %d:\n%s", c.err, n, c.logs, buf.String())
		}
	}
}
