package kafkasec

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
)

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/kafkasec: invalid config")

// Mechanism names a SASL mechanism, as Kafka's sasl.mechanism spells it.
type Mechanism string

// The SASL mechanisms a Config supports.
const (
	// None means no SASL (the zero value).
	None Mechanism = ""
	// Plain is SASL/PLAIN: the password travels as it is, so use it over
	// TLS only.
	Plain Mechanism = "PLAIN"
	// ScramSHA256 is SASL/SCRAM-SHA-256 (RFC 7677).
	ScramSHA256 Mechanism = "SCRAM-SHA-256"
	// ScramSHA512 is SASL/SCRAM-SHA-512.
	ScramSHA512 Mechanism = "SCRAM-SHA-512"
)

// DefaultDialTimeout bounds a connection attempt (TCP, TLS handshake and
// SASL login) when Config.DialTimeout is 0. It is kafka-go's default.
const DefaultDialTimeout = 10 * time.Second

// Config is the security of a Kafka connection: TLS, SASL, both or
// neither (PLAINTEXT, the zero value). Build it once and share it; its
// methods validate it first.
type Config struct {
	// TLS configures encryption and the broker's certificate check.
	TLS TLS
	// SASL configures the login.
	SASL SASL
	// DialTimeout bounds one connection attempt, TLS handshake and SASL
	// login included. Default DefaultDialTimeout (10s); not negative.
	DialTimeout time.Duration
	// ClientID is sent to the broker in every request (quotas, logs).
	// Default "" (kafka-go's default client ID).
	ClientID string
}

// TLS configures TLS. TLS is on when Enabled is true or any other field is
// set.
type TLS struct {
	// Enabled turns TLS on with the system's root CAs when no CA is given.
	Enabled bool
	// CAFile is a PEM file of the CA certificates that sign the brokers'
	// certificates. Default: the system roots. Not together with CAPEM.
	CAFile string
	// CAPEM is CAFile's content given inline.
	CAPEM []byte
	// CertFile and KeyFile are the PEM client certificate (chain) and its
	// private key, for mutual TLS (a listener with ssl.client.auth=required).
	// Both or neither; not together with CertPEM/KeyPEM.
	CertFile, KeyFile string
	// CertPEM and KeyPEM are CertFile and KeyFile's content given inline.
	CertPEM, KeyPEM []byte
	// ServerName is the host name the broker's certificate must carry.
	// Default: the host of the address dialled.
	ServerName string
	// MinVersion is the lowest TLS version accepted: tls.VersionTLS12 (the
	// default) or tls.VersionTLS13.
	MinVersion uint16
	// InsecureSkipVerify accepts any broker certificate: anyone on the path
	// can read and change the traffic. For tests only; not with a CA.
	InsecureSkipVerify bool
}

// SASL configures the SASL login.
type SASL struct {
	// Mechanism is None (no SASL; the default), Plain, ScramSHA256 or
	// ScramSHA512. It must be one the listener enables
	// (sasl.enabled.mechanisms) and for which the user has a credential.
	Mechanism Mechanism
	// Username is the Kafka user (the principal User:<Username> of the
	// ACLs). Required with a Mechanism.
	Username string
	// Password is the user's password. Required with a Mechanism. It never
	// appears in an error or in String's output.
	Password string
}

// String describes the SASL settings without the password.
func (s SASL) String() string {
	if s.Mechanism == None && s.Username == "" && s.Password == "" {
		return "none"
	}
	pw := "unset"
	if s.Password != "" {
		pw = "set"
	}
	return fmt.Sprintf("%s user %q (password %s)", s.Mechanism, s.Username, pw)
}

// GoString is String, so that %#v does not print the password either.
func (s SASL) GoString() string { return "kafkasec.SASL{" + s.String() + "}" }

// String describes the configuration without secrets, e.g.
// "TLS (CA /etc/ca.pem), SASL SCRAM-SHA-512 user "orders" (password set)".
func (c Config) String() string {
	return c.Protocol() + ": TLS " + c.TLS.describe() + ", SASL " + c.SASL.String()
}

func (t TLS) describe() string {
	if !t.on() {
		return "off"
	}
	var parts []string
	switch {
	case t.CAFile != "":
		parts = append(parts, "CA "+t.CAFile)
	case len(t.CAPEM) > 0:
		parts = append(parts, "CA inline")
	default:
		parts = append(parts, "system roots")
	}
	if t.CertFile != "" || len(t.CertPEM) > 0 {
		parts = append(parts, "client certificate")
	}
	if t.ServerName != "" {
		parts = append(parts, "server name "+t.ServerName)
	}
	if t.InsecureSkipVerify {
		parts = append(parts, "INSECURE: certificate not verified")
	}
	return "on (" + strings.Join(parts, ", ") + ")"
}

func (t TLS) on() bool {
	return t.Enabled || t.CAFile != "" || len(t.CAPEM) > 0 || t.CertFile != "" || t.KeyFile != "" ||
		len(t.CertPEM) > 0 || len(t.KeyPEM) > 0 || t.ServerName != "" || t.MinVersion != 0 || t.InsecureSkipVerify
}

// Enabled reports whether c asks for TLS or SASL (false: PLAINTEXT).
func (c Config) Enabled() bool { return c.TLS.on() || c.SASL.Mechanism != None }

// Protocol is Kafka's name of c's security protocol: PLAINTEXT, SSL,
// SASL_PLAINTEXT or SASL_SSL, what the broker's listener must be
// (listener.security.protocol.map).
func (c Config) Protocol() string {
	switch {
	case c.TLS.on() && c.SASL.Mechanism != None:
		return "SASL_SSL"
	case c.TLS.on():
		return "SSL"
	case c.SASL.Mechanism != None:
		return "SASL_PLAINTEXT"
	}
	return "PLAINTEXT"
}

// Validate checks c without building anything but the TLS material (files
// are read, PEM is parsed). Errors wrap ErrInvalidConfig and name the
// field.
func (c Config) Validate() error {
	_, err := c.TLSConfig()
	if err != nil {
		return err
	}
	_, err = c.Mechanism()
	if err != nil {
		return err
	}
	if c.DialTimeout < 0 {
		return fmt.Errorf("%w: DialTimeout %s must not be negative", ErrInvalidConfig, c.DialTimeout)
	}
	return nil
}

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}

// TLSConfig returns the *tls.Config that c.TLS describes, or nil when TLS
// is off. It reads CAFile, CertFile and KeyFile. Errors wrap
// ErrInvalidConfig and name the field.
func (c Config) TLSConfig() (*tls.Config, error) {
	t := c.TLS
	if !t.on() {
		return nil, nil
	}
	minV := t.MinVersion
	if minV == 0 {
		minV = tls.VersionTLS12
	}
	if minV != tls.VersionTLS12 && minV != tls.VersionTLS13 {
		return nil, invalid("TLS.MinVersion %#04x must be tls.VersionTLS12 (%#04x) or tls.VersionTLS13 (%#04x)", minV, tls.VersionTLS12, tls.VersionTLS13)
	}
	cfg := &tls.Config{MinVersion: minV, ServerName: t.ServerName} //nolint:gosec // minV is TLS 1.2 or 1.3, checked above
	caPEM := t.CAPEM
	switch {
	case t.CAFile != "" && len(t.CAPEM) > 0:
		return nil, invalid("TLS.CAFile and TLS.CAPEM are both set; give one")
	case t.CAFile != "":
		b, err := os.ReadFile(t.CAFile) //nolint:gosec // the operator's configured CA path
		if err != nil {
			return nil, invalid("TLS.CAFile: %v", err)
		}
		caPEM = b
	}
	if len(caPEM) > 0 {
		if t.InsecureSkipVerify {
			return nil, invalid("TLS.InsecureSkipVerify is set together with a CA (TLS.CAFile/TLS.CAPEM): choose one")
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(caPEM) {
			return nil, invalid("%s holds no PEM certificate", caField(t))
		}
		cfg.RootCAs = pool
	}
	cfg.InsecureSkipVerify = t.InsecureSkipVerify //nolint:gosec // an explicit, documented opt-in (tests only)
	certPEM, keyPEM := t.CertPEM, t.KeyPEM
	switch {
	case (t.CertFile != "" || t.KeyFile != "") && (len(t.CertPEM) > 0 || len(t.KeyPEM) > 0):
		return nil, invalid("TLS.CertFile/TLS.KeyFile and TLS.CertPEM/TLS.KeyPEM are both set; give one pair")
	case (t.CertFile == "") != (t.KeyFile == ""):
		return nil, invalid("TLS.CertFile and TLS.KeyFile go together (mutual TLS); one is missing")
	case (len(t.CertPEM) == 0) != (len(t.KeyPEM) == 0):
		return nil, invalid("TLS.CertPEM and TLS.KeyPEM go together (mutual TLS); one is missing")
	case t.CertFile != "":
		var err error
		if certPEM, err = os.ReadFile(t.CertFile); err != nil { //nolint:gosec // the operator's configured path
			return nil, invalid("TLS.CertFile: %v", err)
		}
		if keyPEM, err = os.ReadFile(t.KeyFile); err != nil { //nolint:gosec // the operator's configured path
			return nil, invalid("TLS.KeyFile: %v", err)
		}
	}
	if len(certPEM) > 0 {
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			// crypto/tls's message names the problem, not the key's bytes.
			return nil, invalid("TLS.CertFile/TLS.KeyFile (client certificate): %v", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

func caField(t TLS) string {
	if t.CAFile != "" {
		return "TLS.CAFile " + t.CAFile
	}
	return "TLS.CAPEM"
}

// Mechanism returns the kafka-go SASL mechanism that c.SASL describes, or
// nil when SASL is off. Errors wrap ErrInvalidConfig, name the field and
// never contain the password.
func (c Config) Mechanism() (sasl.Mechanism, error) {
	s := c.SASL
	if s.Mechanism == None {
		if s.Username != "" || s.Password != "" {
			return nil, invalid("SASL.Username/SASL.Password are set but SASL.Mechanism is empty (one of %s, %s, %s)", Plain, ScramSHA256, ScramSHA512)
		}
		return nil, nil
	}
	switch {
	case s.Username == "":
		return nil, invalid("SASL.Username is required with SASL.Mechanism %s", s.Mechanism)
	case s.Password == "":
		return nil, invalid("SASL.Password is required with SASL.Mechanism %s (user %q)", s.Mechanism, s.Username)
	}
	switch Mechanism(strings.ToUpper(string(s.Mechanism))) {
	case Plain:
		return plain.Mechanism{Username: s.Username, Password: s.Password}, nil
	case ScramSHA256, ScramSHA512:
		algo := scram.SHA512
		if strings.EqualFold(string(s.Mechanism), string(ScramSHA256)) {
			algo = scram.SHA256
		}
		m, err := scram.Mechanism(algo, s.Username, s.Password)
		if err != nil {
			// The SASLprep error may quote the input: leave it out.
			return nil, invalid("SASL.Username or SASL.Password (user %q) is not valid for %s (SASLprep, RFC 4013)", s.Username, s.Mechanism)
		}
		return m, nil
	}
	return nil, invalid("SASL.Mechanism %q is not one of %s, %s, %s", s.Mechanism, Plain, ScramSHA256, ScramSHA512)
}

// Dialer returns a new *kafka.Dialer with c's TLS and SASL settings and
// DialTimeout, for kafka.ReaderConfig.Dialer (broker/kafkaadapter uses the
// same dialer for the consumer group, the partition readers and, through
// TransportFromDialer, its admin requests). For a PLAINTEXT Config it is a
// dialer like kafka.DefaultDialer. Errors are Validate's.
func (c Config) Dialer() (*kafka.Dialer, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	tc, _ := c.TLSConfig()
	m, _ := c.Mechanism()
	return &kafka.Dialer{Timeout: c.dialTimeout(), DualStack: true, ClientID: c.ClientID, TLS: tc, SASLMechanism: m}, nil
}

func (c Config) dialTimeout() time.Duration {
	if c.DialTimeout > 0 {
		return c.DialTimeout
	}
	return DefaultDialTimeout
}

// Transport returns a new *kafka.Transport with c's TLS and SASL settings,
// for kafka.Writer.Transport, kafka.Client.Transport and kafkapub's
// Config.Transport. For a PLAINTEXT Config with no ClientID or DialTimeout
// it returns a nil interface (not a nil *kafka.Transport in a non-nil
// interface, which kafka-go would call and panic on), so that kafka-go uses
// kafka.DefaultTransport. The Transport holds a connection pool: share it,
// and call CloseIdleConnections when done. Errors are Validate's.
func (c Config) Transport() (kafka.RoundTripper, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if !c.Enabled() && c.ClientID == "" && c.DialTimeout == 0 {
		return nil, nil
	}
	tc, _ := c.TLSConfig()
	m, _ := c.Mechanism()
	return &kafka.Transport{DialTimeout: c.dialTimeout(), ClientID: c.ClientID, TLS: tc, SASL: m}, nil
}

// TransportFromDialer returns a kafka.RoundTripper that connects as d does:
// the same TLS config, SASL mechanism, client ID, timeout and DialFunc (or
// a net.Dialer with d's LocalAddr, KeepAlive, DualStack and FallbackDelay).
// d's Resolver is not used. A nil d gives a nil interface
// (kafka.DefaultTransport). broker/kafkaadapter uses it so that its admin
// requests (the redelivery horizon check, GroupLag) go through the
// Reader's Dialer.
func TransportFromDialer(d *kafka.Dialer) kafka.RoundTripper {
	if d == nil {
		return nil
	}
	t := &kafka.Transport{DialTimeout: d.Timeout, ClientID: d.ClientID, TLS: d.TLS, SASL: d.SASLMechanism}
	if t.DialTimeout == 0 {
		t.DialTimeout = DefaultDialTimeout
	}
	if d.DialFunc != nil {
		t.Dial = d.DialFunc
	} else {
		nd := &net.Dialer{LocalAddr: d.LocalAddr, KeepAlive: d.KeepAlive, FallbackDelay: d.FallbackDelay}
		if !d.DualStack {
			nd.FallbackDelay = -1
		}
		t.Dial = nd.DialContext
	}
	return t
}
