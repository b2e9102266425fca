package integration

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"

	"github.com/idemq/idemq/dedup"
)

// The operator's CLI: migrate, list dead letters, inspect a record, re-drive
// it, purge.
func TestCLIDeadLetterRedrive(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	e := setup(t, nil)
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, append(args, "--dsn", postgresDSN(t), "--schema", e.schema)...).CombinedOutput()
		if err != nil {
			t.Fatalf("idemq %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	run("migrate") // idempotent on an already migrated schema
	res, err := e.store.Process(e.ctx, msg(t, "billing", "m-dl", "inv-9", "x"), (&spy{fail: func(int64, *dedup.Message) error {
		return dedup.Permanent(errors.New("address invalid"))
	}}).handle)
	if err != nil || res.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("%+v %v", res, err)
	}
	if out := run("dead-letters", "list", "--scope", "billing"); !strings.Contains(out, "m-dl") || !strings.Contains(out, "permanent_error") || !strings.Contains(out, "address invalid") {
		t.Fatalf("dead-letters output:\n%s", out)
	}
	if out := run("inspect", "--scope", "billing", "--business-key", "inv-9"); !strings.Contains(out, `"status": "FAILED_FINAL"`) {
		t.Fatalf("inspect output:\n%s", out)
	}
	run("redrive", "--scope", "billing", "--message-id", "m-dl")
	if r := e.record("billing", "m-dl"); r.Status != dedup.StatusFailedRetryable {
		t.Fatalf("after redrive: %+v", r)
	}
	if out := run("dead-letters", "list", "--scope", "billing"); !strings.Contains(out, "true") {
		t.Fatalf("dead letter not stamped as re-driven:\n%s", out)
	}
	if out := run("purge"); !strings.Contains(out, "purged 0") {
		t.Fatalf("purge output: %s", out)
	}
	if out, err := exec.Command(bin, "redrive", "--dsn", postgresDSN(t), "--schema", e.schema, "--scope", "billing", "--message-id", "nope").CombinedOutput(); err == nil {
		t.Fatalf("redrive of an unknown record succeeded: %s", out)
	}
}

// The same operator commands on a Redis-only store (--redis).
func TestCLIRedisStore(t *testing.T) {
	t.Parallel()
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	s := newRedisStore(t, nil)
	url := "redis://" + redisAddress(t) + "/0"
	idemq := func(args ...string) (string, error) {
		out, err := exec.Command(bin, append(args, "--redis", url, "--redis-prefix", s.Config().Prefix)...).CombinedOutput()
		return string(out), err
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := idemq(args...)
		if err != nil {
			t.Fatalf("idemq %v: %v\n%s", args, err, out)
		}
		return out
	}
	res, err := s.ProcessLeased(context.Background(), msg(t, "mailer", "m-dl", "mail-9", "x"), func(context.Context, *dedup.Message) error {
		return dedup.Permanent(errors.New("mailbox unavailable"))
	}, dedup.LeaseOptions{})
	if err != nil || res.Outcome != dedup.OutcomeDeadLetter {
		t.Fatalf("%+v %v", res, err)
	}
	if out := run("dead-letters", "list", "--scope", "mailer"); !strings.Contains(out, "m-dl") || !strings.Contains(out, "permanent_error") || !strings.Contains(out, "mailbox unavailable") {
		t.Fatalf("dead-letters output:\n%s", out)
	}
	if out := run("inspect", "--scope", "mailer", "--business-key", "mail-9"); !strings.Contains(out, `"status": "FAILED_FINAL"`) || !strings.Contains(out, `"message_id": "m-dl"`) {
		t.Fatalf("inspect output:\n%s", out)
	}
	run("redrive", "--scope", "mailer", "--message-id", "m-dl")
	if r, _ := s.Lookup(context.Background(), "mailer", "m-dl"); r.Status != dedup.StatusFailedRetryable {
		t.Fatalf("after redrive: %+v", r)
	}
	if out, err := idemq("redrive", "--scope", "mailer", "--message-id", "nope"); err == nil || !strings.Contains(out, "not found") {
		t.Fatalf("redrive of an unknown record: err %v\n%s", err, out)
	}
	// purge is Postgres only: it has no --redis flag (a usage error, exit 2).
	var exit *exec.ExitError
	if out, err := idemq("purge"); !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(out, "unknown flag: --redis") {
		t.Fatalf("purge --redis: err %v\n%s", err, out)
	}
}
