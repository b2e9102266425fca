package pgstore

import (
	"sync/atomic"

	"github.com/idemq/idemq/dedup"
)

// readRaceHook, when set (by this package's tests only), runs on a read
// path between its read of id's record and its next statement: the tests
// purge the record there, so that a purge meeting a live request is forced
// rather than left to the scheduler. point names the place ("http claimed",
// "http inspect"). Nil in production: a load and a nil check.
var readRaceHook atomic.Pointer[func(point string, id dedup.Identity)]

// raceHook runs readRaceHook at point for id when it is set.
func raceHook(point string, id dedup.Identity) {
	if h := readRaceHook.Load(); h != nil {
		(*h)(point, id)
	}
}
