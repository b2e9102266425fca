package kafkasec

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
)

// ErrAuthentication is wrapped by Explain's error when the broker refused
// the SASL login (kafka.SASLAuthenticationFailed) or the mechanism
// (kafka.UnsupportedSASLMechanism).
var ErrAuthentication = errors.New("idemq/kafkasec: SASL authentication refused")

// ErrSecurityMismatch is wrapped by Explain's error when the connection
// failed in a way that a client and a listener speaking different
// security protocols produce: a TLS handshake that failed or met a
// listener without TLS, or a connection the broker closed at once (EOF,
// reset, kafka.BrokerNotAvailable).
var ErrSecurityMismatch = errors.New("idemq/kafkasec: connection failed; likely a security protocol mismatch")

// Explain returns err wrapped with the likely cause when it is one of the
// unhelpful errors kafka-go returns for a refused SASL login or a
// security-protocol mismatch, else err unchanged (nil for nil). The result
// still wraps err (errors.Is(result, kafka.SASLAuthenticationFailed) holds)
// and adds ErrAuthentication or ErrSecurityMismatch. It names the settings
// to check, never their values. kafka.Client turns a failed connection
// into "Broker Not Available" for most requests; ExplainWith finds the
// real cause of those.
func Explain(err error) error {
	if err == nil || errors.Is(err, ErrAuthentication) || errors.Is(err, ErrSecurityMismatch) {
		return err
	}
	var (
		rec     tls.RecordHeaderError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		verify  *tls.CertificateVerificationError
		alert   tls.AlertError
	)
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed):
		return fmt.Errorf("%w: %w: check SASL.Username, SASL.Password and SASL.Mechanism (the user needs a credential for that mechanism on the broker)", ErrAuthentication, err)
	case errors.Is(err, kafka.UnsupportedSASLMechanism):
		return fmt.Errorf("%w: %w: the listener does not enable SASL.Mechanism (sasl.enabled.mechanisms)", ErrAuthentication, err)
	case errors.Is(err, kafka.IllegalSASLState):
		return fmt.Errorf("%w: %w: the listener is probably not a SASL listener (SASL_SSL or SASL_PLAINTEXT); check the port and SASL.Mechanism", ErrSecurityMismatch, err)
	case errors.As(err, &rec):
		return fmt.Errorf("%w: %w: the listener does not speak TLS (a PLAINTEXT or SASL_PLAINTEXT port?); unset TLS or use the SSL/SASL_SSL port", ErrSecurityMismatch, err)
	case errors.As(err, &unknown), errors.As(err, &verify):
		return fmt.Errorf("%w: %w: the broker's certificate is not signed by TLS.CAFile/TLS.CAPEM (or the system roots)", ErrSecurityMismatch, err)
	case errors.As(err, &host):
		return fmt.Errorf("%w: %w: the broker's certificate does not name the address dialled; set TLS.ServerName", ErrSecurityMismatch, err)
	case errors.As(err, &invalid):
		return fmt.Errorf("%w: %w: the broker's certificate is not valid (expired, or not for server use)", ErrSecurityMismatch, err)
	case errors.As(err, &alert):
		return fmt.Errorf("%w: %w: the broker ended the TLS handshake (a client certificate required or refused: TLS.CertFile/TLS.KeyFile; or no common TLS version: TLS.MinVersion)", ErrSecurityMismatch, err)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, syscall.ECONNRESET), errors.Is(err, kafka.BrokerNotAvailable):
		return fmt.Errorf("%w: %w: the broker closed the connection; the usual cause is a client whose TLS/SASL settings do not match the listener's security protocol (TLS on a PLAINTEXT port, no TLS on an SSL/SASL_SSL port, SASL missing on a SASL port), or a refused login", ErrSecurityMismatch, err)
	}
	return err
}

// ExplainWith is Explain, but when err is kafka-go's "Broker Not
// Available" (what kafka.Client returns for most requests when it could
// not connect, a refused SASL login included), it first sends one Metadata
// request to brokers through rt (bounded by 5s and ctx), which does report
// the connection's own error, and explains that one (wrapping err too).
// rt nil means kafka.DefaultTransport.
func ExplainWith(ctx context.Context, rt kafka.RoundTripper, brokers []string, err error) error {
	if !errors.Is(err, kafka.BrokerNotAvailable) || errors.Is(err, ErrAuthentication) || errors.Is(err, ErrSecurityMismatch) || len(brokers) == 0 {
		return Explain(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Timeout: 5 * time.Second, Transport: rt}
	_, perr := cl.Metadata(pctx, &kafka.MetadataRequest{Topics: []string{}})
	if perr == nil || errors.Is(perr, kafka.BrokerNotAvailable) || pctx.Err() != nil {
		return Explain(err)
	}
	if ex := Explain(perr); ex != perr {
		return fmt.Errorf("%w (%w)", ex, err)
	}
	return Explain(err)
}
