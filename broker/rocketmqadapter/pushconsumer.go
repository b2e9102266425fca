package rocketmqadapter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	rocketmq "github.com/apache/rocketmq-client-go/v2"
	rmqconsumer "github.com/apache/rocketmq-client-go/v2/consumer"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/consumer"
)

// abortWait bounds how long Shutdown waits for handlers after canceling
// them (their rollback and the Handle return).
const abortWait = 10 * time.Second

// PushConsumer is a rocketmq-client-go push consumer in clustering mode whose
// listener is a Listener. Build it with NewPushConsumer, then Start it once
// its topic exists, and Shutdown it at the end.
type PushConsumer struct {
	l   *Listener
	pc  rocketmq.PushConsumer
	cfg Config

	mu          sync.Mutex
	clientState // under mu
}

// NewPushConsumer validates cfg (see NewListener; NameServers, Group and
// Topic are required here) and builds the client and its subscription, whose
// listener runs c. It does not connect: Start does. Errors are NewListener's,
// wrap ErrInvalidConfig naming the missing field, or come from the client.
// c's Scope is usually Group.
func NewPushConsumer(c *consumer.Consumer, cfg Config) (*PushConsumer, error) {
	switch {
	case len(cfg.NameServers) == 0:
		return nil, fmt.Errorf("%w: NameServers is required", ErrInvalidConfig)
	case cfg.Group == "":
		return nil, fmt.Errorf("%w: Group is required", ErrInvalidConfig)
	case cfg.Topic == "":
		return nil, fmt.Errorf("%w: Topic is required", ErrInvalidConfig)
	}
	l, err := NewListener(c, cfg)
	if err != nil {
		return nil, err
	}
	cfg = l.cfg
	opts := append([]rmqconsumer.Option(nil), cfg.ClientOptions...)
	opts = append(opts,
		rmqconsumer.WithGroupName(cfg.Group),
		rmqconsumer.WithNsResolver(primitive.NewPassthroughResolver(cfg.NameServers)),
		rmqconsumer.WithInstance(cfg.InstanceName),
		rmqconsumer.WithConsumerModel(rmqconsumer.Clustering),
		rmqconsumer.WithConsumerOrder(false),
		rmqconsumer.WithConsumeTimeout(cfg.ConsumeTimeout),
		rmqconsumer.WithConsumeMessageBatchMaxSize(cfg.BatchMaxSize),
		rmqconsumer.WithMaxReconsumeTimes(cfg.MaxReconsumeTimes),
		rmqconsumer.WithConsumeGoroutineNums(cfg.ConsumeGoroutines),
	)
	pc, err := rmqconsumer.NewPushConsumer(opts...)
	if err != nil {
		return nil, fmt.Errorf("idemq/rocketmqadapter: new push consumer: %w", err)
	}
	if err := pc.Subscribe(cfg.Topic, cfg.Selector, l.Consume); err != nil {
		_ = pc.Shutdown()
		return nil, fmt.Errorf("idemq/rocketmqadapter: subscribe %s: %w", cfg.Topic, err)
	}
	return &PushConsumer{l: l, pc: pc, cfg: cfg}, nil
}

// Listener returns the listener the consumer runs.
func (p *PushConsumer) Listener() *Listener { return p.l }

// InstanceName returns the client's instance name.
func (p *PushConsumer) InstanceName() string { return p.cfg.InstanceName }

// ErrShutdown is returned by Start after Shutdown.
var ErrShutdown = errors.New("idemq/rocketmqadapter: consumer shut down")

// Start connects to the name servers, joins the group and starts consuming.
// The topic must exist (see EnsureTopic): the client refuses to start when
// the name servers have no route for it. Starting twice is a no-op; a
// consumer whose Start failed cannot be started again (build a new one).
func (p *PushConsumer) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.start(ErrShutdown, p.pc.Start, "consumer group "+p.cfg.Group+" on topic "+p.cfg.Topic)
}

// Shutdown stops consuming: the listener takes no new message, in-flight
// handlers get up to consumer.Config.ShutdownGrace to finish, the client shuts
// down (persisting consumed offsets to the broker), then handlers still
// running are canceled (rolled back, redelivered later) and awaited for up to
// 10s more. It returns the client's shutdown error. Safe to call more than
// once and before Start.
func (p *PushConsumer) Shutdown() error {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return nil
	}
	p.stopped = true
	p.mu.Unlock()

	grace, cancel := context.WithTimeout(context.Background(), p.l.c.Config().ShutdownGrace)
	drained := p.l.Stop(grace) == nil
	cancel()
	err := p.pc.Shutdown()
	p.l.Abort()
	if !drained {
		wait, cancel := context.WithTimeout(context.Background(), abortWait)
		if p.l.Stop(wait) != nil {
			p.l.log.Warn("idemq: handlers still running after shutdown; their messages will be redelivered")
		}
		cancel()
	}
	if err != nil {
		return fmt.Errorf("idemq/rocketmqadapter: shutdown: %w", err)
	}
	return nil
}
