package dedup

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
)

var (
	k1 = FingerprintKey{ID: "k1", Secret: []byte("0123456789abcdef-one")}
	k2 = FingerprintKey{ID: "k2", Secret: []byte("0123456789abcdef-two")}
)

func TestFingerprintRotation(t *testing.T) {
	old, err := NewFingerprinter(nil, k1)
	if err != nil {
		t.Fatal(err)
	}
	sum, id, err := old.Sum([]byte(`{"amount":40}`))
	if err != nil || id != "k1" || len(sum) != 32 {
		t.Fatalf("Sum = %x %q %v", sum, id, err)
	}
	// After rotation k2 is current and k1 still verifies old records.
	rotated, err := NewFingerprinter(nil, k2, k1)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := rotated.Matches([]byte(`{"amount":40}`), sum, "k1"); !ok || err != nil {
		t.Fatalf("old record under previous key: %v %v", ok, err)
	}
	if ok, _ := rotated.Matches([]byte(`{"amount":45}`), sum, "k1"); ok {
		t.Fatal("different payload matched")
	}
	newSum, id, _ := rotated.Sum([]byte(`{"amount":40}`))
	if id != "k2" || bytes.Equal(newSum, sum) {
		t.Fatal("new fingerprints must use the current key")
	}
	all, err := rotated.Sums([]byte(`{"amount":40}`))
	if err != nil || len(all) != 2 || !bytes.Equal(all["k2"], newSum) || !bytes.Equal(all["k1"], sum) {
		t.Fatalf("Sums = %+v, %v; want the current key's sum and the previous key's", all, err)
	}
	if ids := rotated.KeyIDs(); len(ids) != 2 || ids[0] != "k2" || ids[1] != "k1" {
		t.Fatalf("KeyIDs = %v, want current key first", ids)
	}
	onlyNew, _ := NewFingerprinter(nil, k2)
	if _, err := onlyNew.Matches([]byte(`{"amount":40}`), sum, "k1"); !errors.Is(err, ErrUnknownFingerprintKey) {
		t.Fatalf("unknown key ID: err = %v", err)
	}
}

func TestFingerprintCanonicalizer(t *testing.T) {
	// Canonical JSON without trace_id: two copies differing only in trace ID match.
	canon := func(b []byte) ([]byte, error) {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, err
		}
		delete(m, "trace_id")
		return json.Marshal(m) // encoding/json sorts map keys
	}
	f, _ := NewFingerprinter(canon, k1)
	a, _, _ := f.Sum([]byte(`{"amount":40,"order":"o-1","trace_id":"t-1"}`))
	if ok, err := f.Matches([]byte(`{"trace_id":"t-2","order":"o-1","amount":40}`), a, "k1"); !ok || err != nil {
		t.Fatalf("canonical copies differ: %v %v", ok, err)
	}
	if _, _, err := f.Sum([]byte(`not json`)); err == nil {
		t.Fatal("canonicalizer error not returned")
	}
}

func TestNewFingerprinterValidates(t *testing.T) {
	for _, keys := range [][]FingerprintKey{
		nil,
		{{ID: "", Secret: k1.Secret}},
		{{ID: "short", Secret: []byte("too short")}},
		{k1, {ID: "k1", Secret: k2.Secret}},
	} {
		if _, err := NewFingerprinter(nil, keys...); err == nil {
			t.Fatalf("keys %v accepted", keys)
		}
	}
}
