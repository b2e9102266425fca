package kafkasec

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
)

// testPKI is an in-memory CA, a server certificate for 127.0.0.1/localhost
// and a client certificate, all signed by the CA.
type testPKI struct {
	caPEM, serverCert, serverKey, clientCert, clientKey []byte
}

func newPKI(t *testing.T) testPKI {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(serial int64, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "localhost"},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalPKCS8PrivateKey(k)
		return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	}
	p := testPKI{caPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})}
	p.serverCert, p.serverKey = leaf(2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf(3, x509.ExtKeyUsageClientAuth)
	return p
}

func write(t *testing.T, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// hidden is a password that must never show in an error or String.
const hidden = "s3cr3t-Passw0rd"

func TestValidateNamesFieldNeverPassword(t *testing.T) {
	pki := newPKI(t)
	missing := filepath.Join(t.TempDir(), "nope.pem")
	cases := []struct {
		name  string
		cfg   Config
		field string
	}{
		{"unknown mechanism", Config{SASL: SASL{Mechanism: "GSSAPI", Username: "u", Password: hidden}}, "SASL.Mechanism"},
		{"no user", Config{SASL: SASL{Mechanism: ScramSHA512, Password: hidden}}, "SASL.Username"},
		{"no password", Config{SASL: SASL{Mechanism: ScramSHA256, Username: "u"}}, "SASL.Password"},
		{"credentials without mechanism", Config{SASL: SASL{Username: "u", Password: hidden}}, "SASL.Mechanism"},
		{"CA file missing", Config{TLS: TLS{CAFile: missing}, SASL: SASL{Mechanism: Plain, Username: "u", Password: hidden}}, "TLS.CAFile"},
		{"CA not PEM", Config{TLS: TLS{CAPEM: []byte("not a certificate")}}, "TLS.CAPEM"},
		{"CA twice", Config{TLS: TLS{CAFile: write(t, "ca.pem", pki.caPEM), CAPEM: pki.caPEM}}, "TLS.CAFile and TLS.CAPEM"},
		{"cert without key", Config{TLS: TLS{CertFile: write(t, "c.pem", pki.clientCert)}}, "TLS.KeyFile"},
		{"key without cert", Config{TLS: TLS{KeyPEM: pki.clientKey}}, "TLS.CertPEM"},
		{"cert and key mismatch", Config{TLS: TLS{CertPEM: pki.clientCert, KeyPEM: pki.serverKey}}, "TLS.CertFile/TLS.KeyFile"},
		{"TLS 1.1", Config{TLS: TLS{MinVersion: tls.VersionTLS11}}, "TLS.MinVersion"},
		{"insecure with CA", Config{TLS: TLS{CAPEM: pki.caPEM, InsecureSkipVerify: true}}, "TLS.InsecureSkipVerify"},
		{"negative timeout", Config{DialTimeout: -time.Second}, "DialTimeout"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, f := range []func() error{
				c.cfg.Validate,
				func() error { _, err := c.cfg.Dialer(); return err },
				func() error { _, err := c.cfg.Transport(); return err },
			} {
				err := f()
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("err = %v, want ErrInvalidConfig", err)
				}
				if !strings.Contains(err.Error(), c.field) {
					t.Errorf("err = %q, want it to name %s", err, c.field)
				}
				if strings.Contains(err.Error(), hidden) {
					t.Errorf("err = %q contains the password", err)
				}
			}
		})
	}
}

func TestStringHidesPassword(t *testing.T) {
	c := Config{TLS: TLS{CAFile: "/etc/ca.pem"}, SASL: SASL{Mechanism: ScramSHA512, Username: "orders", Password: hidden}}
	for _, s := range []string{c.String(), fmt.Sprintf("%v", c), fmt.Sprintf("%+v", c), fmt.Sprintf("%#v", c.SASL), fmt.Sprint(c.SASL)} {
		if strings.Contains(s, hidden) {
			t.Errorf("%q contains the password", s)
		}
	}
	if got := c.String(); !strings.Contains(got, "SASL_SSL") || !strings.Contains(got, `"orders"`) || !strings.Contains(got, "password set") {
		t.Errorf("String() = %q, want the protocol, the user and 'password set'", got)
	}
}

func TestProtocol(t *testing.T) {
	s := SASL{Mechanism: ScramSHA256, Username: "u", Password: "p"}
	for _, c := range []struct {
		cfg  Config
		want string
	}{{Config{}, "PLAINTEXT"}, {Config{TLS: TLS{Enabled: true}}, "SSL"}, {Config{SASL: s}, "SASL_PLAINTEXT"}, {Config{TLS: TLS{Enabled: true}, SASL: s}, "SASL_SSL"}} {
		if got := c.cfg.Protocol(); got != c.want {
			t.Errorf("%v: Protocol() = %s, want %s", c.cfg, got, c.want)
		}
	}
}

// A PLAINTEXT Config gives a nil interface, not a nil *kafka.Transport in a
// non-nil interface (kafka-go would call it and panic), and a kafka.Client
// given it works.
func TestTransportNilWhenPlaintext(t *testing.T) {
	rt, err := Config{}.Transport()
	if err != nil {
		t.Fatal(err)
	}
	if rt != nil {
		t.Fatalf("Transport() = %#v (%T), want a nil interface", rt, rt)
	}
	w := &kafka.Writer{Addr: kafka.TCP("127.0.0.1:1"), Transport: rt}
	defer w.Close()
	if got := TransportFromDialer(nil); got != nil {
		t.Fatalf("TransportFromDialer(nil) = %#v, want a nil interface", got)
	}
	// With a ClientID there is a Transport.
	rt, _ = Config{ClientID: "idemq"}.Transport()
	if tr, ok := rt.(*kafka.Transport); !ok || tr == nil || tr.ClientID != "idemq" {
		t.Fatalf("Transport() = %#v, want a *kafka.Transport with the client ID", rt)
	}
}

func TestMechanisms(t *testing.T) {
	for _, m := range []Mechanism{Plain, ScramSHA256, ScramSHA512, "scram-sha-512"} {
		c := Config{SASL: SASL{Mechanism: m, Username: "u", Password: "p"}}
		mech, err := c.Mechanism()
		if err != nil {
			t.Fatalf("%s: %v", m, err)
		}
		if !strings.EqualFold(mech.Name(), string(m)) {
			t.Errorf("%s: mechanism %s", m, mech.Name())
		}
		d, err := c.Dialer()
		if err != nil || d.SASLMechanism == nil || d.TLS != nil || d.Timeout != DefaultDialTimeout {
			t.Errorf("%s: Dialer() = %+v, %v", m, d, err)
		}
		rt, _ := c.Transport()
		if tr := rt.(*kafka.Transport); tr.SASL == nil || tr.TLS != nil {
			t.Errorf("%s: Transport() = %+v", m, tr)
		}
	}
}

// The built tls.Config verifies the test CA's server certificate, presents
// the client certificate to a server that requires one (mutual TLS), and
// refuses a server certificate of another CA.
func TestTLSConfigHandshake(t *testing.T) {
	pki := newPKI(t)
	other := newPKI(t)
	serverPair, err := tls.X509KeyPair(pki.serverCert, pki.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs := x509.NewCertPool()
	clientCAs.AppendCertsFromPEM(pki.caPEM)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serverPair},
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: clientCAs, MinVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = c.(*tls.Conn).Handshake(); _, _ = io.Copy(io.Discard, c); _ = c.Close() }()
		}
	}()
	handshake := func(cfg Config) error {
		tc, err := cfg.TLSConfig()
		if err != nil {
			return err
		}
		d, err := cfg.Dialer()
		if err != nil {
			return err
		}
		want := cfg.TLS.MinVersion
		if want == 0 {
			want = tls.VersionTLS12 // the default
		}
		if d.TLS == nil || d.TLS.MinVersion != want {
			t.Fatalf("Dialer TLS MinVersion = %v, want %#04x", d.TLS != nil && d.TLS.MinVersion == want, want)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err := (&tls.Dialer{Config: tc}).DialContext(ctx, "tcp", ln.Addr().String())
		if err != nil {
			return err
		}
		defer c.Close()
		// TLS 1.3: a refused client certificate shows at the first read.
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		_, err = c.Read(make([]byte, 1))
		if ne, ok := err.(net.Error); ok && ne.Timeout() {
			return nil
		}
		return err
	}
	mutual := Config{TLS: TLS{CAFile: write(t, "ca.pem", pki.caPEM), CertFile: write(t, "c.pem", pki.clientCert), KeyFile: write(t, "k.pem", pki.clientKey)}}
	if err := handshake(mutual); err != nil {
		t.Fatalf("mutual TLS with the right CA and client certificate: %v", err)
	}
	inline := Config{TLS: TLS{CAPEM: pki.caPEM, CertPEM: pki.clientCert, KeyPEM: pki.clientKey, ServerName: "localhost", MinVersion: tls.VersionTLS13}}
	if err := handshake(inline); err != nil {
		t.Fatalf("inline PEM, ServerName localhost, TLS 1.3: %v", err)
	}
	err = handshake(Config{TLS: TLS{CAPEM: other.caPEM, CertPEM: pki.clientCert, KeyPEM: pki.clientKey}})
	if err == nil {
		t.Fatal("a server certificate of another CA was accepted")
	}
	if ex := Explain(err); !errors.Is(ex, ErrSecurityMismatch) || !strings.Contains(ex.Error(), "TLS.CAFile") {
		t.Errorf("Explain(%v) = %v, want ErrSecurityMismatch naming TLS.CAFile", err, ex)
	}
	if err := handshake(Config{TLS: TLS{CAPEM: pki.caPEM}}); err == nil {
		t.Error("no client certificate, yet the server requiring one accepted")
	}
	if err := handshake(Config{TLS: TLS{InsecureSkipVerify: true, CertPEM: pki.clientCert, KeyPEM: pki.clientKey}}); err != nil {
		t.Errorf("InsecureSkipVerify: %v", err)
	}
}

func TestExplain(t *testing.T) {
	if Explain(nil) != nil {
		t.Fatal("Explain(nil) != nil")
	}
	plain := errors.New("something else")
	if Explain(plain) != plain {
		t.Error("an unrelated error was changed")
	}
	for _, c := range []struct {
		err       error
		sentinel  error
		mentioned string
	}{
		{fmt.Errorf("metadata: %w", kafka.SASLAuthenticationFailed), ErrAuthentication, "SASL.Password"},
		{kafka.UnsupportedSASLMechanism, ErrAuthentication, "sasl.enabled.mechanisms"},
		{io.EOF, ErrSecurityMismatch, "security protocol"},
		{fmt.Errorf("x: %w", io.ErrUnexpectedEOF), ErrSecurityMismatch, "TLS"},
		{kafka.BrokerNotAvailable, ErrSecurityMismatch, "listener"},
		{tls.RecordHeaderError{Msg: "first record does not look like a TLS handshake"}, ErrSecurityMismatch, "does not speak TLS"},
	} {
		got := Explain(c.err)
		if !errors.Is(got, c.sentinel) || !errors.Is(got, c.err) || !strings.Contains(got.Error(), c.mentioned) {
			t.Errorf("Explain(%v) = %v, want %v wrapping the error and mentioning %q", c.err, got, c.sentinel, c.mentioned)
		}
		if again := Explain(got); again != got {
			t.Errorf("Explain twice wrapped again: %v", again)
		}
	}
}
