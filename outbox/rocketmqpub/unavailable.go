package rocketmqpub

import (
	"errors"
	"strconv"
	"strings"

	rmqerrors "github.com/apache/rocketmq-client-go/v2/errors"
	"github.com/apache/rocketmq-client-go/v2/primitive"
	"github.com/idemq/idemq/outbox"
)

// Broker response codes that say the broker cannot or will not take any
// write now, whatever the row (see classify).
const (
	codeSystemBusy          = 2  // SYSTEM_BUSY: flow control (page cache busy, queue wait too long)
	codeServiceNotAvailable = 14 // SERVICE_NOT_AVAILABLE: broker shutting down, disk full, slave
	codeNoPermission        = 16 // NO_PERMISSION: authentication or authorization refused (ACL)
)

// unavailableCodes are the response codes classify wraps with
// outbox.Unavailable.
var unavailableCodes = map[int]bool{codeSystemBusy: true, codeServiceNotAvailable: true, codeNoPermission: true}

// classify wraps a send error with outbox.Unavailable when the broker is
// unavailable to every row, so the relay pauses (its breaker) and counts no
// attempt instead of parking rows:
//   - the client's request timeout (rocketmq-client-go's ErrRequestTimeout);
//   - SYSTEM_BUSY (2), the broker's flow control;
//   - SERVICE_NOT_AVAILABLE (14): a broker shutting down, a full disk, a
//     write to a slave;
//   - NO_PERMISSION (16): the broker refused the Credentials (unknown
//     access key, bad signature, no PUB permission). A credentials or ACL
//     mistake is fixed by the operator, after which the rows drain in
//     order; parking them would lose that order.
//
// Transport errors need no wrapping: outbox.IsUnavailable knows them. Every
// other code (TOPIC_NOT_EXIST 17, MESSAGE_ILLEGAL 13, a route not found, …)
// is left a row error.
func classify(err error) error {
	if errors.Is(err, rmqerrors.ErrRequestTimeout) || unavailableCodes[responseCode(err)] {
		return outbox.Unavailable(err)
	}
	return err
}

// responseCode returns the broker response code of a send error of
// rocketmq-client-go: a primitive.MQBrokerErr, or its "CODE: 16, DESC: …"
// text (ProcessSendResponse formats the code into a plain error); -1 when
// there is none.
func responseCode(err error) int {
	var be primitive.MQBrokerErr
	if errors.As(err, &be) {
		return int(be.ResponseCode)
	}
	var pbe *primitive.MQBrokerErr
	if errors.As(err, &pbe) && pbe != nil {
		return int(pbe.ResponseCode)
	}
	s := err.Error()
	i := strings.LastIndex(s, "CODE: ")
	if i < 0 {
		return -1
	}
	s = s[i+len("CODE: "):]
	j := 0
	for j < len(s) && s[j] >= '0' && s[j] <= '9' {
		j++
	}
	n, perr := strconv.Atoi(s[:j])
	if perr != nil {
		return -1
	}
	return n
}
