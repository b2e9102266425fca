package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/broker/kafkasec"
	"github.com/idemq/idemq/outbox"
	"github.com/spf13/pflag"
)

// The environment variables of the broker secrets. Secrets are never flag
// values (they would show in ps and shell history): they come from these
// variables or from a file flag.
//
// gosec's G101 reads these names as credentials; they are the names of
// where credentials come from, holding none.
const (
	envKafkaSASLPassword  = "IDEMQ_KAFKA_SASL_PASSWORD" //nolint:gosec // a variable's name, not a credential
	envRocketMQAccessKey  = "IDEMQ_ROCKETMQ_ACCESS_KEY"
	envRocketMQSecretKey  = "IDEMQ_ROCKETMQ_SECRET_KEY" //nolint:gosec // a variable's name, not a credential
	flagKafkaPasswordFile = "kafka-sasl-password-file"  //nolint:gosec // a flag's name, not a credential
	flagRocketMQSecretKey = "rocketmq-secret-key-file"
)

// kafkaSecFlags are the TLS and SASL flags of a Kafka connection
// (kafkasec.Config).
var kafkaSecFlags = []string{"kafka-tls", "kafka-tls-ca", "kafka-tls-cert", "kafka-tls-key", "kafka-tls-server-name",
	"kafka-tls-insecure-skip-verify", "kafka-sasl-mechanism", "kafka-sasl-user", flagKafkaPasswordFile}

// rocketMQSecFlags are the ACL flags of a RocketMQ connection.
var rocketMQSecFlags = []string{"rocketmq-access-key", flagRocketMQSecretKey}

// brokerSecFlags are the security flags of brokerFlags: Kafka TLS/SASL and
// RocketMQ ACL credentials. check resolves them into sec and cred.
type brokerSecFlags struct {
	fs *pflag.FlagSet

	tls, tlsInsecure                          bool
	tlsCA, tlsCert, tlsKey, tlsServerName     string
	saslMechanism, saslUser, saslPasswordFile string
	rocketMQAccessKey, rocketMQSecretKeyFile  string

	// sec and cred are the resolved settings (after check).
	sec  kafkasec.Config
	cred primitive.Credentials
}

func (s *brokerSecFlags) register(fs *pflag.FlagSet) {
	s.fs = fs
	fs.BoolVar(&s.tls, "kafka-tls", false, "Kafka: connect with TLS (implied by any --kafka-tls-* flag); the system roots verify the brokers unless --kafka-tls-ca")
	fs.StringVar(&s.tlsCA, "kafka-tls-ca", "", "Kafka: PEM `FILE` of the CA certificates that sign the brokers' certificates")
	fs.StringVar(&s.tlsCert, "kafka-tls-cert", "", "Kafka: PEM `FILE` of the client certificate, for mutual TLS (with --kafka-tls-key)")
	fs.StringVar(&s.tlsKey, "kafka-tls-key", "", "Kafka: PEM `FILE` of the client certificate's private key (with --kafka-tls-cert)")
	fs.StringVar(&s.tlsServerName, "kafka-tls-server-name", "", "Kafka: host `NAME` the brokers' certificates must carry (default: the host dialled)")
	fs.BoolVar(&s.tlsInsecure, "kafka-tls-insecure-skip-verify", false, "Kafka: accept any broker certificate; FOR TESTS ONLY (anyone on the path can read and change the traffic); not with --kafka-tls-ca")
	fs.StringVar(&s.saslMechanism, "kafka-sasl-mechanism", "", "Kafka: SASL `MECHANISM`: plain, scram-sha-256 or scram-sha-512 (with --kafka-sasl-user and a password from "+envKafkaSASLPassword+" or --"+flagKafkaPasswordFile+")")
	fs.StringVar(&s.saslUser, "kafka-sasl-user", "", "Kafka: SASL user `NAME`")
	fs.StringVar(&s.saslPasswordFile, flagKafkaPasswordFile, "", "Kafka: `FILE` holding the SASL password (one trailing newline trimmed); else env "+envKafkaSASLPassword+" (never a flag value)")
	fs.StringVar(&s.rocketMQAccessKey, "rocketmq-access-key", "", "RocketMQ: ACL access `KEY` (ACL 2.0: the user name), with a secret key from "+envRocketMQSecretKey+" or --"+flagRocketMQSecretKey)
	bindEnv(fs, "rocketmq-access-key", envRocketMQAccessKey)
	fs.StringVar(&s.rocketMQSecretKeyFile, flagRocketMQSecretKey, "", "RocketMQ: `FILE` holding the ACL secret key (one trailing newline trimmed); else env "+envRocketMQSecretKey+" (never a flag value)")
}

// kafkaFieldFlags names kafkasec's Config fields as the flags that set
// them, for its validation errors.
var kafkaFieldFlags = strings.NewReplacer(
	"TLS.CertFile/TLS.KeyFile", "--kafka-tls-cert/--kafka-tls-key",
	"TLS.CAFile/TLS.CAPEM", "--kafka-tls-ca",
	"TLS.CAFile", "--kafka-tls-ca", "TLS.CertFile", "--kafka-tls-cert", "TLS.KeyFile", "--kafka-tls-key",
	"TLS.ServerName", "--kafka-tls-server-name", "TLS.InsecureSkipVerify", "--kafka-tls-insecure-skip-verify",
	"SASL.Mechanism", "--kafka-sasl-mechanism", "SASL.Username", "--kafka-sasl-user",
	"SASL.Password", "the SASL password ("+envKafkaSASLPassword+" or --"+flagKafkaPasswordFile+")",
)

// check validates the security flags for broker (kafka or rocketmq) and
// resolves the secrets, which a remembers for redaction. Every mistake is
// a usage error, found before any connection; no error holds a secret.
// A secret's environment variable of the other broker is ignored (one
// environment may serve both); its flags are refused.
func (s *brokerSecFlags) check(a *app, broker string) error {
	// Both brokers' secrets of the environment are redacted, used or not.
	a.secrets = append(a.secrets, a.getenv(envKafkaSASLPassword), a.getenv(envRocketMQSecretKey))
	other := rocketMQSecFlags
	if broker == "rocketmq" {
		other = kafkaSecFlags
	}
	for _, n := range other {
		if s.fs.Changed(n) {
			return usagef("--%s is not for --broker %s", n, broker)
		}
	}
	if broker == "rocketmq" {
		return s.checkRocketMQ(a)
	}
	return s.checkKafka(a)
}

func (s *brokerSecFlags) checkKafka(a *app) error {
	password, from, err := secret(a, envKafkaSASLPassword, flagKafkaPasswordFile, s.saslPasswordFile)
	if err != nil {
		return err
	}
	mech := kafkasec.Mechanism(strings.ToUpper(s.saslMechanism))
	switch {
	case s.saslMechanism != "" && mech != kafkasec.Plain && mech != kafkasec.ScramSHA256 && mech != kafkasec.ScramSHA512:
		return usagef("--kafka-sasl-mechanism %q: want plain, scram-sha-256 or scram-sha-512", s.saslMechanism)
	case mech == kafkasec.None && s.saslUser != "":
		return usagef("--kafka-sasl-user is set but --kafka-sasl-mechanism is not (plain, scram-sha-256 or scram-sha-512)")
	case mech == kafkasec.None && password != "":
		return usagef("a SASL password is set (%s) but --kafka-sasl-mechanism is not (plain, scram-sha-256 or scram-sha-512)", from)
	case mech != kafkasec.None && s.saslUser == "":
		return usagef("--kafka-sasl-mechanism %s needs --kafka-sasl-user", s.saslMechanism)
	case mech != kafkasec.None && password == "":
		return usagef("--kafka-sasl-mechanism %s needs a password: set %s or pass --%s", s.saslMechanism, envKafkaSASLPassword, flagKafkaPasswordFile)
	case (s.tlsCert == "") != (s.tlsKey == ""):
		return usagef("--kafka-tls-cert and --kafka-tls-key go together (mutual TLS); one is missing")
	}
	s.sec = kafkasec.Config{
		TLS: kafkasec.TLS{Enabled: s.tls, CAFile: s.tlsCA, CertFile: s.tlsCert, KeyFile: s.tlsKey,
			ServerName: s.tlsServerName, InsecureSkipVerify: s.tlsInsecure},
		SASL: kafkasec.SASL{Mechanism: mech, Username: s.saslUser, Password: password},
	}
	if err := s.sec.Validate(); err != nil {
		// kafkasec's errors name fields, never the password.
		msg := strings.TrimPrefix(err.Error(), kafkasec.ErrInvalidConfig.Error()+": ")
		return usagef("%s", kafkaFieldFlags.Replace(msg))
	}
	return nil
}

func (s *brokerSecFlags) checkRocketMQ(a *app) error {
	secretKey, from, err := secret(a, envRocketMQSecretKey, flagRocketMQSecretKey, s.rocketMQSecretKeyFile)
	if err != nil {
		return err
	}
	switch {
	case s.rocketMQAccessKey == "" && secretKey != "":
		return usagef("a RocketMQ secret key is set (%s) but no access key: pass --rocketmq-access-key or set %s", from, envRocketMQAccessKey)
	case s.rocketMQAccessKey != "" && secretKey == "":
		return usagef("--rocketmq-access-key needs a secret key: set %s or pass --%s", envRocketMQSecretKey, flagRocketMQSecretKey)
	}
	s.cred = primitive.Credentials{AccessKey: s.rocketMQAccessKey, SecretKey: secretKey}
	return nil
}

// secret reads a secret from the file of flag (one trailing newline
// trimmed) or else from the environment variable env; from says where it
// came from. Both given is a usage error. The secret joins a.secrets, so no
// printed error can show it.
func secret(a *app, env, flag, file string) (value, from string, err error) {
	fromEnv := a.getenv(env)
	if file != "" {
		if fromEnv != "" {
			return "", "", usagef("--%s and %s are both set; give one", flag, env)
		}
		b, err := os.ReadFile(file) //nolint:gosec // the operator names the file
		if err != nil {
			var pe *os.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return "", "", usagef("--%s %q: %v", flag, file, err)
		}
		v := strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
		if v == "" {
			return "", "", usagef("--%s %q is empty", flag, file)
		}
		a.secrets = append(a.secrets, v)
		return v, "--" + flag, nil
	}
	a.secrets = append(a.secrets, fromEnv)
	return fromEnv, env, nil
}

// describe is the security of the connection for the logs, without
// secrets.
func (s *brokerSecFlags) describe(broker string) string {
	if broker == "rocketmq" {
		if s.cred.AccessKey == "" {
			return "no ACL credentials"
		}
		return fmt.Sprintf("ACL access key %q (secret key set)", s.cred.AccessKey)
	}
	return s.sec.String()
}

// errPublisher is a closingPublisher that remembers the last publish
// error, so relay --once can say why the broker failed (an outage's rows
// are not logged by the relay, and a refused login is an outage).
type errPublisher struct {
	closingPublisher
	mu   sync.Mutex
	last error
}

// chainPublisher is what both publishers of the CLI are.
type chainPublisher interface {
	closingPublisher
	outbox.ChainPublisher
	outbox.MessagingSystem
}

func (p *errPublisher) note(err error) {
	if err != nil {
		p.mu.Lock()
		p.last = err
		p.mu.Unlock()
	}
}

// Publish publishes and remembers a failure.
func (p *errPublisher) Publish(ctx context.Context, batch []outbox.Envelope) error {
	err := p.closingPublisher.Publish(ctx, batch)
	p.note(err)
	return err
}

// lastErr is the last publish error, or nil.
func (p *errPublisher) lastErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.last
}

// errChainPublisher is errPublisher for a chain publisher (both of the
// CLI's): PublishChains and MessagingSystem pass through.
type errChainPublisher struct {
	*errPublisher
	cp chainPublisher
}

// PublishChains publishes and remembers the first failed chain's error.
func (p errChainPublisher) PublishChains(ctx context.Context, chains [][]outbox.Envelope) []outbox.ChainResult {
	res := p.cp.PublishChains(ctx, chains)
	for _, r := range res {
		p.note(r.Err)
	}
	return res
}

// MessagingSystem is the wrapped publisher's.
func (p errChainPublisher) MessagingSystem() string { return p.cp.MessagingSystem() }

// withLastErr wraps pub to remember its last publish error; last reads it.
func withLastErr(pub closingPublisher) (wrapped closingPublisher, last func() error) {
	ep := &errPublisher{closingPublisher: pub}
	if cp, ok := pub.(chainPublisher); ok {
		return errChainPublisher{errPublisher: ep, cp: cp}, ep.lastErr
	}
	return ep, ep.lastErr
}
