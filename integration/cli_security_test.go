package integration

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/idemq/idemq/wire"
	"github.com/segmentio/kafka-go"
)

// cliRunEnv is cliRun with extra environment variables (the broker
// secrets, which the CLI takes from the environment only).
func cliRunEnv(t *testing.T, bin string, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		code = exit.ExitCode()
	case err != nil:
		t.Fatalf("idemq %v: %v", args, err)
	}
	return o.String(), e.String(), code
}

// readSASL reads n messages of partition 0 of topic over SASL_SSL (admin
// user) and returns their message-ID headers.
func (k saslKafka) readSASL(t *testing.T, topic string, n int) map[string]bool {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: k.brokers, Topic: topic, Partition: 0, Dialer: mustDialer(t, k.admin()),
		MaxWait: 100 * time.Millisecond})
	defer func() { _ = r.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	got := map[string]bool{}
	for len(got) < n {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			t.Fatalf("read %s over SASL_SSL after %d messages: %v", topic, len(got), err)
		}
		got[header(m, wire.MessageIDHeader)] = true
	}
	return got
}

// `idemq relay --once` over SASL_SSL (TLS with the test CA, SCRAM-SHA-512,
// the password from IDEMQ_KAFKA_SASL_PASSWORD) creates the topic
// (--create-topics through the same Transport) and publishes every row
// with its message ID; the password appears nowhere in the output.
func TestCLIRelayOverSASLSSL(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	o := setupOutbox(t)
	topic := k.name("cli")
	want := o.addRows(t, topic, 40, 4, "cli-sasl")
	out, errOut, code := cliRunEnv(t, bin, []string{"IDEMQ_KAFKA_SASL_PASSWORD=" + k.password},
		"relay", "--once", "--dsn", postgresDSN(t), "--schema", o.schema, "--broker", "kafka",
		"--kafka-brokers", strings.Join(k.brokers, ","), "--kafka-tls-ca", k.ca,
		"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", k.user, "--create-topics", "-v")
	if code != 0 || !strings.Contains(out, "published 40\n") || !strings.Contains(out, "pending 0\n") {
		t.Fatalf("relay --once over SASL_SSL: exit %d\n%s%s", code, out, errOut)
	}
	if strings.Contains(out+errOut, k.password) {
		t.Fatalf("the SASL password is in the output:\n%s%s", out, errOut)
	}
	if !strings.Contains(errOut, "SASL_SSL") {
		t.Errorf("the start log does not name the security protocol:\n%s", errOut)
	}
	if s := o.stats(t); s.Published != 40 || s.Pending != 0 || s.Parked != 0 {
		t.Fatalf("outbox after the drain: %+v", s)
	}
	got := k.readSASL(t, topic, len(want))
	for id := range want {
		if !got[id] {
			t.Fatalf("row %s is not on %s (%d of %d message IDs there)", id, topic, len(got), len(want))
		}
	}
}

// A wrong SASL password: relay --once exits 1 with an authentication error,
// shows neither password, and parks nothing (a refused login is an
// outage, not the rows' fault): every row stays pending with no attempt.
func TestCLIRelayOnceWrongSASLPassword(t *testing.T) {
	t.Parallel()
	k := kafkaSASL(t)
	bin := buildExample(t, "github.com/idemq/idemq/cmd/idemq")
	o := setupOutbox(t)
	topic := k.topic(t, 1)
	o.addRows(t, topic, 6, 3, "cli-sasl-bad")
	const wrong = "not-the-password-5d1f"
	out, errOut, code := cliRunEnv(t, bin, []string{"IDEMQ_KAFKA_SASL_PASSWORD=" + wrong},
		"relay", "--once", "--dsn", postgresDSN(t), "--schema", o.schema, "--max-attempts", "1", "--publish-timeout", "15s",
		"--kafka-brokers", strings.Join(k.brokers, ","), "--kafka-tls-ca", k.ca,
		"--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", k.user)
	if code != 1 || !strings.Contains(errOut, "SASL authentication refused") || !strings.Contains(out, "published 0\n") {
		t.Fatalf("relay --once, wrong password: exit %d, want 1 with an authentication error\n%s%s", code, out, errOut)
	}
	t.Logf("relay --once, wrong password:\n%s%s", out, errOut)
	if strings.Contains(out+errOut, wrong) || strings.Contains(out+errOut, k.password) {
		t.Fatalf("a password is in the output:\n%s%s", out, errOut)
	}
	if s := o.stats(t); s.Parked != 0 || s.Pending != 6 || s.Published != 0 {
		t.Fatalf("outbox after the refused login: %+v, want 6 pending, none parked", s)
	}
	var attempts int
	if err := o.pool.QueryRow(o.ctx, `select coalesce(max(attempts), 0) from `+o.ob.QualifiedTable()).Scan(&attempts); err != nil {
		t.Fatal(err)
	}
	if attempts != 0 {
		t.Fatalf("a refused login counted %d attempts on a row, want 0", attempts)
	}
}
