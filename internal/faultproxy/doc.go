// Package faultproxy is a TCP proxy for tests that loses one reply of a real
// server (Redis, Postgres) on demand: the request reaches the server, the
// server runs it and answers, and the client never sees the answer; its
// connection dies instead. The outcome is unknown to the client although
// the work was done, which is the fault behind S18 ("a reply lost and the
// call retried") and behind a COMMIT that landed unseen.
//
// It is a test helper: New takes a testing.TB, fails that test on setup
// errors and closes the proxy in the test's cleanup. It links no database or
// Redis client; it reads the wire protocols itself (RESP for Redis,
// Postgres for Postgres, or any Protocol the caller defines).
//
// What it supports, and nothing more:
//
//   - Pass-through: every connection accepted on Addr is forwarded, byte for
//     byte, to a new connection to the target, and back.
//   - Drop one reply: DropReplyOnce arms the proxy with a predicate over
//     whole requests. The first request that matches, on any connection, is
//     forwarded; the server's answer is swallowed until the Protocol's
//     ReplyDone says it is whole, then both sides of that connection are
//     closed. The proxy disarms itself, so later requests (the client's
//     retry on a new connection) pass through. Dropped and WaitDropped count
//     the swallowed replies.
//
// Requests are cut out of the client's byte stream by the Protocol's Frame,
// so a predicate always sees one whole request, never a fragment of a TCP
// read. Replies are not framed: while a reply is being swallowed, anything
// else the server sends on that connection is swallowed with it (with
// pipelined requests, the replies still in flight before the matched one).
//
// Usage, in front of the test Redis:
//
//	p := faultproxy.New(t, redisAddr, faultproxy.RESP)
//	c := redis.NewClient(&redis.Options{Addr: p.Addr()})
//	p.DropReplyOnce(func(req []byte) bool {
//		sc, ok := faultproxy.AsScript(req)
//		return ok && sc.HasKey(":lease:")
//	})
//	... // the call under test, which go-redis retries
//	p.WaitDropped(1)
//
// In front of Postgres, point a pgx pool's ConnConfig Host and Port at Addr
// and set DefaultQueryExecMode to pgx.QueryExecModeDescribeExec, so that
// each statement's text is on the wire (a Parse message) every time it
// runs; SQLHas, CommitAfter, ExecOf and IsCommit build predicates over it.
package faultproxy
