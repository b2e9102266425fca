package redisfast

import (
	"bytes"
	"testing"

	"github.com/idemq/idemq/dedup"
)

func TestEncodeDecode(t *testing.T) {
	e := dedup.FastPathEntry{KeyID: "2026:11", Fingerprint: []byte{1, 2, 0xff}}
	got, ok := decode(encode(e))
	if !ok || got.KeyID != e.KeyID || !bytes.Equal(got.Fingerprint, e.Fingerprint) {
		t.Fatalf("round trip = %+v %v", got, ok)
	}
	for _, v := range []string{"", "claim:worker-1", "s1:", "s1:k1:", "s1:k1:zz", "s2:k1:00"} {
		if _, ok := decode(v); ok {
			t.Errorf("decode(%q) accepted a value that is not a SUCCEEDED entry", v)
		}
	}
}

func TestNewValidates(t *testing.T) {
	if _, err := New(Config{}); err == nil {
		t.Fatal("nil client accepted")
	}
}
