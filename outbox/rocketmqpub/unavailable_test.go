package rocketmqpub

import (
	"errors"
	"fmt"
	"testing"

	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/outbox"
)

// Broker refusals that hold for every row (flow control, a broker not
// serving, credentials or permissions refused) are outages for the relay;
// the row's own faults stay row errors.
func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err         error
		unavailable bool
	}{
		// As rocketmq-client-go's ProcessSendResponse formats them.
		{brokerErr("CODE: 16, DESC: check signature failed."), true},
		{brokerErr("CODE: 16, DESC: User:nobody is not found."), true},
		{errors.New("CODE: 2, DESC: [TIMEOUT_CLEAN_QUEUE]broker busy, start flow control for a while"), true},
		{errors.New("CODE: 14, DESC: service not available now. It may be caused by one of the following reasons: the broker's disk is full"), true},
		{primitive.MQBrokerErr{ResponseCode: 2, ErrorMessage: "busy"}, true},
		{&primitive.MQBrokerErr{ResponseCode: 16, ErrorMessage: "no permission"}, true},
		{rmqerrors.ErrRequestTimeout, true},
		{brokerErr("CODE: 17, DESC: topic[x] not exist, apply first please!"), false},
		{errors.New("CODE: 13, DESC: the message body size over max value"), false},
		{errors.New("CODE: 1, DESC: system error"), false},
		{errors.New("CODE: x"), false},
		{errors.New("route info not found"), false},
	} {
		err := classify(fmt.Errorf("idemq/rocketmqpub: send m-1 to t: %w", c.err))
		if got := outbox.IsUnavailable(err); got != c.unavailable {
			t.Errorf("classify(%v): IsUnavailable = %v, want %v", c.err, got, c.unavailable)
		}
		if !errors.Is(err, c.err) {
			t.Errorf("classify(%v) lost the cause: %v", c.err, err)
		}
	}
}

// brokerErr is an error with the text rocketmq-client-go formats from a
// broker's answer (the broker's own punctuation and capitals included).
func brokerErr(text string) error { return errors.New(text) }
