package httpidem

import (
	"bytes"
	"errors"
	"testing"
)

// DescribeStoredResponse reads plain responses whole, sealed ones only as
// sealed (never opened: it has no key), oversized ones without a body, and
// refuses what it cannot read.
func TestDescribeStoredResponse(t *testing.T) {
	r := sampleResponse()
	blob, keyID, err := encodeResponse(r, responseOptions{})
	if err != nil {
		t.Fatal(err)
	}
	info, err := DescribeStoredResponse(blob, keyID)
	if err != nil {
		t.Fatal(err)
	}
	if info.Sealed || info.KeyID != "" || info.Status != 201 || info.Oversized || info.ResourceID != "order-42" ||
		info.Header.Get("Location") != "/orders/42" || !bytes.Equal(info.Body, r.Body) || info.StoredBytes != len(blob) {
		t.Fatalf("plain: %+v", info)
	}

	blob, _, err = encodeResponse(r, responseOptions{MaxBytes: 4})
	if err != nil {
		t.Fatal(err)
	}
	if info, err = DescribeStoredResponse(blob, ""); err != nil || !info.Oversized || info.Body != nil || info.Status != 201 || info.ResourceID != "order-42" {
		t.Fatalf("oversized: %+v %v", info, err)
	}

	s, _ := NewAESGCM("k1", map[string][]byte{"k1": key(1, 32)})
	blob, keyID, err = encodeResponse(r, responseOptions{Sealer: s, Record: []byte("scope\x00key")})
	if err != nil {
		t.Fatal(err)
	}
	info, err = DescribeStoredResponse(blob, keyID)
	if err != nil || !info.Sealed || info.KeyID != "k1" || info.StoredBytes != len(blob) || info.Status != 0 ||
		info.Body != nil || info.Header != nil || info.ResourceID != "" || info.Oversized {
		t.Fatalf("sealed: %+v %v", info, err)
	}

	for name, c := range map[string]struct {
		blob  []byte
		keyID string
	}{
		"empty":                 {nil, ""},
		"unknown version":       {[]byte{9, 0, 1}, ""},
		"sealed without key ID": {blob, ""},
		"plain with a key ID":   {[]byte{responseFormatV1, 0, 0xc9, 1, 0}, "k1"},
		"truncated payload":     {[]byte{responseFormatV1, 0, 0xc9}, ""},
	} {
		if _, err := DescribeStoredResponse(c.blob, c.keyID); !errors.Is(err, errCorruptResponse) {
			t.Errorf("%s: err %v, want errCorruptResponse", name, err)
		}
	}
}
