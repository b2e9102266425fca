package rocketmqadapter

import "fmt"

// clientState is the start-once life of a rocketmq-client-go consumer, shared
// by Source and PushConsumer; its owner guards it with its own mutex.
type clientState struct {
	started bool
	stopped bool  // closed or shut down: never started again
	err     error // the failed start: a client whose Start failed cannot start again
}

// start starts the client once: stoppedErr after a stop, the earlier error
// after a failed start, nil when already started. what names the client in
// the error (the group and topic).
func (c *clientState) start(stoppedErr error, startClient func() error, what string) error {
	switch {
	case c.stopped:
		return stoppedErr
	case c.err != nil:
		return c.err
	case c.started:
		return nil
	}
	if err := startClient(); err != nil {
		c.err = fmt.Errorf("idemq/rocketmqadapter: start %s (the topic must exist before Start; see EnsureTopic): %w", what, err)
		return c.err
	}
	c.started = true
	return nil
}
