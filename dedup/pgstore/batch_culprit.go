package pgstore

import (
	"context"

	"github.com/idemq/idemq/dedup"
)

// rerunOneByOne is ProcessBatch's way out of a batch that cannot commit:
// each message in its own transaction with Process's semantics (Reject for
// bad input), in order, stopping after the first one that must be retried
// later so that order holds. A message that made the batch fail is then
// marked like any failing handler (its attempt counted, FAILED_FINAL and a
// dead letter after MaxAttempts), and the others commit. An error on the
// first message is returned as ProcessBatch's error (nothing is durable); on
// a later one it becomes that message's Err with Outcome "" (see
// ProcessBatch).
//
// sole, when set, is the failure of the only message a BatchHandler ran in
// the failed try: that message is marked with it, as Process marks a
// handler failure after its rollback, without running the handler again
// (one execution, one attempt).
func (s *Store) rerunOneByOne(ctx context.Context, msgs []*dedup.Message, fps []batchFP, h Handler, called []bool, sole *soleFailure) ([]dedup.Result, error) {
	results := make([]dedup.Result, len(msgs))
	for i, m := range msgs {
		var res dedup.Result
		var err error
		switch {
		case fps[i].err != nil:
			res, err = s.Reject(ctx, m, dedup.ReasonBadInput, fps[i].err)
		case sole != nil && sole.i == i:
			res, err = s.markFailed(ctx, failure{msg: m, sum: fps[i].sum, keyID: fps[i].keyID, err: sole.err, finalReason: dedup.ReasonAttemptsExhausted})
			err = wrapUnknown(err)
		default:
			res, err = s.Process(ctx, m, h)
		}
		res.HandlerCalled = res.HandlerCalled || called[i]
		if err != nil {
			if i == 0 {
				out := calledResults(called)
				out[0].HandlerCalled = res.HandlerCalled
				return out, err
			}
			results[i] = dedup.Result{HandlerCalled: res.HandlerCalled, Err: err}
			return results, nil
		}
		results[i] = res
		if res.Outcome == dedup.OutcomeRetry {
			break
		}
	}
	return results, nil
}

// calledResults are the results of a batch that is not durable: only
// HandlerCalled is set.
func calledResults(called []bool) []dedup.Result {
	out := make([]dedup.Result, len(called))
	for i, c := range called {
		out[i].HandlerCalled = c
	}
	return out
}
