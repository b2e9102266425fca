package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

const (
	testKafkaPassword = "kafkaPW-9f3e1c" //nolint:gosec // a test secret, to prove it is never printed
	testRocketSecret  = "rmqSK-77ab20"   //nolint:gosec // a test secret, to prove it is never printed
)

// writeFile writes content to a fresh file of the test and returns its
// path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// Every inconsistent broker security setting is a usage error (exit 2)
// naming the flag, found before any connection, and never shows a secret.
func TestBrokerSecurityUsageErrors(t *testing.T) {
	kafka := []string{"relay", "--dsn", testDSN, "--kafka-brokers", "127.0.0.1:1"}
	rocket := []string{"relay", "--dsn", testDSN, "--broker", "rocketmq", "--rocketmq-namesrv", "127.0.0.1:1"}
	asNew := []string{"redrive", "--as-new", "--scope", "s", "--id", "3", "--dsn", testDSN, "--kafka-brokers", "127.0.0.1:1"}
	pwEnv := map[string]string{envKafkaSASLPassword: testKafkaPassword}
	skEnv := map[string]string{envRocketMQSecretKey: testRocketSecret}
	pwFile := writeFile(t, "pw", testKafkaPassword+"\n")
	emptyFile := writeFile(t, "empty", "\n")
	notPEM := writeFile(t, "ca.pem", "not a certificate "+testKafkaPassword)
	missing := filepath.Join(t.TempDir(), "missing.pem")
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }
	for _, c := range []struct {
		env  map[string]string
		args []string
		want string
	}{
		{pwEnv, with(kafka, "--kafka-sasl-mechanism", "scram-sha-512"), "--kafka-sasl-mechanism scram-sha-512 needs --kafka-sasl-user"},
		{nil, with(kafka, "--kafka-sasl-mechanism", "scram-sha-512", "--kafka-sasl-user", "u"), "needs a password: set IDEMQ_KAFKA_SASL_PASSWORD or pass --kafka-sasl-password-file"},
		{pwEnv, with(kafka, "--kafka-sasl-mechanism", "scram-sha-1", "--kafka-sasl-user", "u"), `--kafka-sasl-mechanism "scram-sha-1": want plain, scram-sha-256 or scram-sha-512`},
		{pwEnv, with(kafka, "--kafka-sasl-user", "u"), "--kafka-sasl-user is set but --kafka-sasl-mechanism is not"},
		{pwEnv, kafka, "a SASL password is set (IDEMQ_KAFKA_SASL_PASSWORD) but --kafka-sasl-mechanism is not"},
		{nil, with(kafka, "--kafka-sasl-password-file", pwFile), "a SASL password is set (--kafka-sasl-password-file) but --kafka-sasl-mechanism is not"},
		{pwEnv, with(kafka, "--kafka-sasl-mechanism", "plain", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", pwFile), "--kafka-sasl-password-file and IDEMQ_KAFKA_SASL_PASSWORD are both set"},
		{nil, with(kafka, "--kafka-sasl-mechanism", "plain", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", missing), "--kafka-sasl-password-file"},
		{nil, with(kafka, "--kafka-sasl-mechanism", "plain", "--kafka-sasl-user", "u", "--kafka-sasl-password-file", emptyFile), "is empty"},
		{nil, with(kafka, "--kafka-tls-cert", pwFile), "--kafka-tls-cert and --kafka-tls-key go together"},
		{nil, with(kafka, "--kafka-tls-key", pwFile), "--kafka-tls-cert and --kafka-tls-key go together"},
		{nil, with(kafka, "--kafka-tls-ca", missing), "--kafka-tls-ca:"},
		{nil, with(kafka, "--kafka-tls-ca", notPEM), "holds no PEM certificate"},
		{nil, with(kafka, "--kafka-tls-ca", pwFile, "--kafka-tls-insecure-skip-verify"), "--kafka-tls-insecure-skip-verify is set together with a CA"},
		{nil, with(kafka, "--rocketmq-access-key", "ak"), "--rocketmq-access-key is not for --broker kafka"},
		{nil, with(kafka, "--rocketmq-secret-key-file", pwFile), "--rocketmq-secret-key-file is not for --broker kafka"},
		{nil, with(rocket, "--kafka-tls"), "--kafka-tls is not for --broker rocketmq"},
		{nil, with(rocket, "--kafka-sasl-user", "u"), "--kafka-sasl-user is not for --broker rocketmq"},
		{nil, with(rocket, "--kafka-tls-ca", pwFile), "--kafka-tls-ca is not for --broker rocketmq"},
		{nil, with(rocket, "--rocketmq-access-key", "ak"), "--rocketmq-access-key needs a secret key: set IDEMQ_ROCKETMQ_SECRET_KEY or pass --rocketmq-secret-key-file"},
		{map[string]string{envRocketMQAccessKey: "ak"}, rocket, "--rocketmq-access-key needs a secret key"},
		{skEnv, rocket, "a RocketMQ secret key is set (IDEMQ_ROCKETMQ_SECRET_KEY) but no access key"},
		{skEnv, with(rocket, "--rocketmq-access-key", "ak", "--rocketmq-secret-key-file", pwFile), "--rocketmq-secret-key-file and IDEMQ_ROCKETMQ_SECRET_KEY are both set"},
		{nil, with(asNew, "--kafka-sasl-user", "u"), "--kafka-sasl-user is set but --kafka-sasl-mechanism is not"},
		{nil, with(asNew, "--broker", "rocketmq", "--rocketmq-namesrv", "n:1", "--kafka-tls"), "--kafka-tls is not for --broker rocketmq"},
	} {
		r := cli(t, c.env, panicStore{}, c.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "--help' for usage") {
			t.Errorf("idemq %q: want exit 2 with %q\n%v", c.args, c.want, r)
		}
		if out := r.stdout + r.stderr; strings.Contains(out, testKafkaPassword) || strings.Contains(out, testRocketSecret) {
			t.Errorf("idemq %q: a secret is in the output:\n%v", c.args, r)
		}
	}
}

// Environment variables of the other broker are ignored (one environment
// may serve both), and a password file's trailing newline is trimmed.
func TestBrokerSecurityResolved(t *testing.T) {
	a := &app{getenv: envMap{envRocketMQSecretKey: testRocketSecret, envKafkaSASLPassword: testKafkaPassword}.get}
	b := brokerFlags{broker: "kafka", kafkaBrokers: "k:9094", partitions: 1}
	b.sec.register(pflag.NewFlagSet("t", pflag.ContinueOnError)) // nothing Changed
	b.sec.saslMechanism, b.sec.saslUser = "scram-sha-256", "orders"
	if err := b.check(a); err != nil {
		t.Fatal(err)
	}
	if s := b.sec.sec; s.SASL.Password != testKafkaPassword || s.SASL.Mechanism != "SCRAM-SHA-256" || s.Protocol() != "SASL_PLAINTEXT" {
		t.Fatalf("resolved %v", s)
	}
	if d := b.sec.describe("kafka"); strings.Contains(d, testKafkaPassword) || !strings.Contains(d, `user "orders"`) {
		t.Fatalf("describe = %q", d)
	}
	if got := a.redact("x " + testKafkaPassword + " y"); got != "x xxxxx y" {
		t.Fatalf("redact = %q", got)
	}

	a = &app{getenv: envMap{envKafkaSASLPassword: testKafkaPassword}.get}
	b = brokerFlags{broker: "rocketmq", namesrv: "n:9876"}
	b.sec.register(pflag.NewFlagSet("t", pflag.ContinueOnError))
	b.sec.rocketMQAccessKey, b.sec.rocketMQSecretKeyFile = "ak", writeFile(t, "sk", testRocketSecret+"\r\n")
	if err := b.check(a); err != nil {
		t.Fatal(err)
	}
	if b.sec.cred.AccessKey != "ak" || b.sec.cred.SecretKey != testRocketSecret {
		t.Fatalf("credentials %q/%q", b.sec.cred.AccessKey, b.sec.cred.SecretKey)
	}
	if d := b.sec.describe("rocketmq"); strings.Contains(d, testRocketSecret) || a.redact(testRocketSecret) != "xxxxx" {
		t.Fatalf("describe = %q", d)
	}
}

type envMap map[string]string

func (m envMap) get(k string) string { return m[k] }

// Help lists the security flags and names their environment variables,
// and never shows a secret of the environment.
func TestBrokerSecurityHelp(t *testing.T) {
	env := map[string]string{envKafkaSASLPassword: testKafkaPassword, envRocketMQSecretKey: testRocketSecret, envRocketMQAccessKey: "ak-env"}
	for _, cmd := range [][]string{{"relay", "--help"}, {"redrive", "--help"}} {
		r := cli(t, env, nil, cmd...)
		if r.code != exitOK {
			t.Fatalf("%v: %v", cmd, r)
		}
		for _, want := range []string{"--kafka-tls ", "--kafka-tls-ca FILE", "--kafka-tls-cert FILE", "--kafka-tls-key FILE",
			"--kafka-tls-server-name NAME", "--kafka-tls-insecure-skip-verify", "FOR TESTS ONLY", "--kafka-sasl-mechanism MECHANISM",
			"scram-sha-512", "--kafka-sasl-user NAME", "--kafka-sasl-password-file FILE", envKafkaSASLPassword,
			"--rocketmq-access-key KEY", envRocketMQAccessKey, "--rocketmq-secret-key-file FILE", envRocketMQSecretKey} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("idemq %v does not show %q", cmd, want)
			}
		}
		if strings.Contains(r.stdout+r.stderr, testKafkaPassword) || strings.Contains(r.stdout+r.stderr, testRocketSecret) || strings.Contains(r.stdout, "ak-env") {
			t.Errorf("idemq %v shows a value of the environment:\n%s", cmd, r.stdout)
		}
		if strings.Contains(r.stdout, "--kafka-sasl-password ") || strings.Contains(r.stdout, "--rocketmq-secret-key ") {
			t.Errorf("idemq %v has a secret-valued flag", cmd)
		}
	}
}

// With secrets in the environment, no run of the commands shows them: a
// usage error, a relay whose database is down (exit 1) and one whose
// broker is unreachable.
func TestBrokerSecretsNeverPrinted(t *testing.T) {
	env := map[string]string{envKafkaSASLPassword: testKafkaPassword, envRocketMQSecretKey: testRocketSecret,
		envRocketMQAccessKey: "ak", "IDEMQ_DATABASE_URL": testDSN}
	sasl := []string{"--kafka-brokers", "127.0.0.1:1", "--kafka-sasl-mechanism", "plain", "--kafka-sasl-user", "u", "--kafka-tls"}
	for _, c := range []struct {
		args []string
		code int
	}{
		{append([]string{"relay", "--once", "-v"}, sasl...), exitRuntime},
		{append([]string{"relay", "--once", "-v", "--log-format", "json"}, sasl...), exitRuntime},
		{[]string{"relay", "--once", "-v", "--broker", "rocketmq", "--rocketmq-namesrv", "127.0.0.1:1"}, exitRuntime},
		{append([]string{"relay", "--once", "--batch-size", "20000"}, sasl...), exitUsage},
		{[]string{"relay", "--once", "--kafka-brokers", "127.0.0.1:1"}, exitUsage}, // password without mechanism
		{append([]string{"redrive", "--as-new", "--scope", "s", "--id", "1"}, sasl...), exitRuntime},
	} {
		r := cli(t, env, nil, c.args...)
		if r.code != c.code {
			t.Errorf("idemq %q: want exit %d\n%v", c.args, c.code, r)
		}
		if out := r.stdout + r.stderr; strings.Contains(out, testKafkaPassword) || strings.Contains(out, testRocketSecret) {
			t.Errorf("idemq %q: a secret is in the output:\n%v", c.args, r)
		}
	}
}
