package rocketmqpub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/apache/rocketmq-client-go/v2/producer"
	"github.com/idemq/idemq/outbox"
)

// Config configures a Publisher. Every zero value but NameServers means the
// default in the field's comment.
type Config struct {
	// NameServers are the NameServer addresses ("host:port"). Required.
	NameServers []string
	// GroupName is the producer group. Default "idemq_relay".
	GroupName string
	// InstanceName must differ between clients of one process. Default
	// "idemq-relay-<pid>-<8 random hex digits>".
	InstanceName string
	// Retries is how often the client re-sends after a send error before
	// reporting failure to the relay (which retries with its own backoff).
	// Default 2; must not be negative (zero means the default) and must be
	// zero with DisableRetries.
	Retries int
	// DisableRetries makes the client send once: a send error goes straight
	// to the relay, which retries the row with its own backoff. Default
	// false (retry Retries times).
	DisableRetries bool
	// SendTimeout bounds one send. Default 3s.
	SendTimeout time.Duration
	// Concurrency is how many sends (Publish) or keys (PublishChains) of one
	// call run at once. Default 8; 1 to 256.
	Concurrency int
	// Credentials sign every request of the producer for an ACL-enabled
	// broker: access key, secret key and an optional security token
	// (RocketMQ 5.x ACL 2.0: the user's name and password). Default none
	// (unsigned). A send the broker refuses with NO_PERMISSION (wrong
	// credentials, no PUB permission) is an outage for the relay
	// (outbox.IsUnavailable): it pauses and parks nothing.
	Credentials primitive.Credentials
}

// ErrInvalidConfig is wrapped by every Config error.
var ErrInvalidConfig = errors.New("idemq/rocketmqpub: invalid config")

// ErrNotSendOK wraps a send whose status was not SEND_OK (e.g. a flush or
// slave timeout): the message may be stored, but not as durably as asked, so
// the row is published again and the consumer's dedup absorbs the copy. It
// is an outage (outbox.IsUnavailable), not the row's fault: the relay
// pauses and counts no attempt, as for a request timeout
// (rocketmq-client-go's ErrRequestTimeout), transport errors and the
// broker codes SYSTEM_BUSY, SERVICE_NOT_AVAILABLE and NO_PERMISSION (see
// classify). Other send errors (an unknown topic or route, a rejected
// message) are row errors.
var ErrNotSendOK = errors.New("idemq/rocketmqpub: send status not SEND_OK")

// Publisher publishes outbox envelopes with a started RocketMQ producer. It is
// safe for concurrent use.
type Publisher struct {
	p   rocketmq.Producer
	cfg Config
}

// New validates cfg, creates the producer and starts it. Errors wrap
// ErrInvalidConfig, or are the client's start error.
func New(cfg Config) (*Publisher, error) {
	if len(cfg.NameServers) == 0 {
		return nil, fmt.Errorf("%w: NameServers is required", ErrInvalidConfig)
	}
	if err := cfg.validateNames(); err != nil {
		return nil, err
	}
	switch c := cfg.Credentials; {
	case c.AccessKey == "" && (c.SecretKey != "" || c.SecurityToken != ""):
		return nil, fmt.Errorf("%w: Credentials.AccessKey is empty but a secret key or security token is set", ErrInvalidConfig)
	case c.AccessKey != "" && c.SecretKey == "":
		return nil, fmt.Errorf("%w: Credentials.SecretKey is empty for access key %q", ErrInvalidConfig, c.AccessKey)
	}
	if cfg.GroupName == "" {
		cfg.GroupName = "idemq_relay"
	}
	if cfg.InstanceName == "" {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		cfg.InstanceName = fmt.Sprintf("idemq-relay-%d-%s", os.Getpid(), hex.EncodeToString(b))
	}
	switch {
	case cfg.Retries < 0:
		return nil, fmt.Errorf("%w: Retries %d must not be negative; to send once set DisableRetries", ErrInvalidConfig, cfg.Retries)
	case cfg.DisableRetries && cfg.Retries != 0:
		return nil, fmt.Errorf("%w: Retries %d is set together with DisableRetries; leave it zero", ErrInvalidConfig, cfg.Retries)
	case cfg.Retries == 0 && !cfg.DisableRetries:
		cfg.Retries = 2
	}
	if cfg.SendTimeout == 0 {
		cfg.SendTimeout = 3 * time.Second
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 8
	}
	switch {
	case cfg.SendTimeout < 0:
		return nil, fmt.Errorf("%w: SendTimeout %s must not be negative", ErrInvalidConfig, cfg.SendTimeout)
	case cfg.Concurrency < 1 || cfg.Concurrency > 256:
		return nil, fmt.Errorf("%w: Concurrency %d must be 1 to 256", ErrInvalidConfig, cfg.Concurrency)
	}
	opts := []producer.Option{
		producer.WithNsResolver(primitive.NewPassthroughResolver(cfg.NameServers)),
		producer.WithGroupName(cfg.GroupName),
		producer.WithInstanceName(cfg.InstanceName),
		producer.WithRetry(cfg.Retries),
		producer.WithSendMsgTimeout(cfg.SendTimeout),
		producer.WithQueueSelector(producer.NewHashQueueSelector()),
	}
	if cfg.Credentials.AccessKey != "" {
		opts = append(opts, producer.WithCredentials(cfg.Credentials))
	}
	p, err := rocketmq.NewProducer(opts...)
	if err != nil {
		return nil, fmt.Errorf("idemq/rocketmqpub: new producer: %w", err)
	}
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("idemq/rocketmqpub: start producer: %w", err)
	}
	return &Publisher{p: p, cfg: cfg}, nil
}

// Close shuts the producer down.
func (p *Publisher) Close() error { return p.p.Shutdown() }

// Message converts an envelope to the RocketMQ message Publish sends: body,
// user properties from the headers, Keys and sharding key from the key.
func Message(e outbox.Envelope) *primitive.Message {
	m := primitive.NewMessage(e.Topic, e.Payload)
	for k, v := range e.Headers {
		m.WithProperty(k, v)
	}
	if len(e.Key) > 0 {
		k := string(e.Key)
		m.WithKeys([]string{k})
		m.WithShardingKey(k)
	}
	return m
}

// Publish implements outbox.Publisher: one SendSync per envelope, up to
// Config.Concurrency at once. It returns nil or outbox.PublishErrors.
func (p *Publisher) Publish(ctx context.Context, batch []outbox.Envelope) error {
	errs := make(outbox.PublishErrors, len(batch))
	sem := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range batch {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			errs[i] = p.send(ctx, batch[i])
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return errs
		}
	}
	return nil
}

// PublishChains implements outbox.ChainPublisher: each chain's rows are sent
// in order, one SendSync at a time, and a chain stops at its first failure,
// so the stored rows of a chain are a prefix of it; chains run in parallel,
// up to Config.Concurrency at once.
func (p *Publisher) PublishChains(ctx context.Context, chains [][]outbox.Envelope) []outbox.ChainResult {
	res := make([]outbox.ChainResult, len(chains))
	sem := make(chan struct{}, p.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range chains {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			for _, e := range chains[i] {
				if err := p.send(ctx, e); err != nil {
					res[i].Err = err
					return
				}
				res[i].Acked++
			}
		}()
	}
	wg.Wait()
	return res
}

func (p *Publisher) send(ctx context.Context, e outbox.Envelope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	res, err := p.p.SendSync(ctx, Message(e))
	if err != nil {
		return classify(fmt.Errorf("idemq/rocketmqpub: send %s to %s: %w", e.ID, e.Topic, err))
	}
	if res.Status != primitive.SendOK {
		// A flush or slave timeout, or no slave: the broker could not store
		// the message as durably as asked, nothing about the row.
		return outbox.Unavailable(fmt.Errorf("%w: %s to %s: status %d", ErrNotSendOK, e.ID, e.Topic, res.Status))
	}
	return nil
}

// validateNames checks the fields New checks before it starts a client.
func (c Config) validateNames() error {
	for i, ns := range c.NameServers {
		if ns == "" {
			return fmt.Errorf("%w: NameServers[%d] is empty", ErrInvalidConfig, i)
		}
	}
	return nil
}
