package integration

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/idemq/idemq/wire"
)

// `idemq relay --once` drains the outbox and exits: every committed row is on
// the topic with its message ID, every row is marked published, and the
// command prints the totals. A second run finds nothing and publishes
// nothing.
func TestCLIRelayOnceDrains(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	o := setupOutbox(t)
	topic := newTopic(t, 1)
	want := o.addRows(t, topic, 1200, 7, "once") // more than one batch of 500
	run := func() string {
		t.Helper()
		out, err := exec.Command(bin, "relay", "--once", "--dsn", postgresDSN(t), "--schema", o.schema,
			"--kafka-brokers", strings.Join(kafkaBrokers(t), ","), "--name", "cron-relay").CombinedOutput()
		if err != nil {
			t.Fatalf("idemq relay --once: %v\n%s", err, out)
		}
		return string(out)
	}
	if out := run(); !strings.Contains(out, "published 1200\n") || !strings.Contains(out, "failed 0\n") {
		t.Fatalf("first run output:\n%s", out)
	}
	if s := o.stats(t); s.Published != 1200 || s.Pending != 0 {
		t.Fatalf("outbox after the drain: %+v, want 1200 published, none pending", s)
	}
	got := map[string]bool{}
	for _, m := range obReadAll(t, topic, 1)[0] {
		got[header(m, wire.MessageIDHeader)] = true
	}
	for id := range want {
		if !got[id] {
			t.Fatalf("row %s is not on %s (%d of %d message IDs there)", id, topic, len(got), len(want))
		}
	}
	if out := run(); !strings.Contains(out, "published 0\n") {
		t.Fatalf("second run output:\n%s", out)
	}
	if n := len(obReadAll(t, topic, 1)[0]); n != 1200 {
		t.Fatalf("%d messages on %s after the second run, want 1200", n, topic)
	}
}
