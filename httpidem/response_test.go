package httpidem

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
)

func sampleResponse() storedResponse {
	h := http.Header{}
	h.Set("Content-Type", "application/json")
	h.Set("Location", "/orders/42")
	h.Add("ETag", `"v1"`)
	h.Set("Set-Cookie", "session=secret")
	h.Set("X-Request-Id", "r-1")
	h.Set("Content-Length", "17")
	h.Add("Link", "</a>; rel=a")
	h.Add("Link", "</b>; rel=b")
	return storedResponse{Status: 201, Header: h, Body: []byte(`{"id":42,"ok":true}`), ResourceID: "order-42"}
}

func roundTrip(t *testing.T, r storedResponse, opt responseOptions) (storedResponse, []byte, string) {
	t.Helper()
	blob, keyID, err := encodeResponse(r, opt)
	if err != nil {
		t.Fatalf("encodeResponse: %v", err)
	}
	got, err := decodeResponse(blob, keyID, opt)
	if err != nil {
		t.Fatalf("decodeResponse: %v", err)
	}
	return got, blob, keyID
}

func TestResponseRoundTripDefaults(t *testing.T) {
	r := sampleResponse()
	got, blob, keyID := roundTrip(t, r, responseOptions{})
	if keyID != "" || blob[0] != responseFormatV1 || blob[1] != 0 {
		t.Errorf("plain blob: keyID %q, head % x", keyID, blob[:2])
	}
	want := storedResponse{
		Status: 201,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/orders/42"},
			"Etag":         {`"v1"`},
		},
		Body:       r.Body,
		ResourceID: "order-42",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("round trip:\n got %+v\nwant %+v", got, want)
	}
	// The input is not modified.
	if !reflect.DeepEqual(r, sampleResponse()) {
		t.Error("encodeResponse modified its input")
	}
	// Empty body and no headers.
	got, _, _ = roundTrip(t, storedResponse{Status: 204}, responseOptions{})
	if got.Status != 204 || len(got.Body) != 0 || len(got.Header) != 0 || got.Oversized {
		t.Errorf("204: %+v", got)
	}
}

func TestResponseAllowList(t *testing.T) {
	opt := responseOptions{AllowHeaders: []string{"link", "X-REQUEST-ID", "content-length", "Transfer-Encoding", "Set-Cookie", "X-Absent"}}
	got, _, _ := roundTrip(t, sampleResponse(), opt)
	want := http.Header{
		"Link":         {"</a>; rel=a", "</b>; rel=b"},
		"X-Request-Id": {"r-1"},
		"Set-Cookie":   {"session=secret"}, // explicitly allowed
	}
	if !reflect.DeepEqual(got.Header, want) {
		t.Errorf("headers = %v, want %v (Content-Length never stored)", got.Header, want)
	}
	got, _, _ = roundTrip(t, sampleResponse(), responseOptions{AllowHeaders: []string{}})
	if len(got.Header) != 0 {
		t.Errorf("empty allow list stored %v", got.Header)
	}
	if _, _, err := encodeResponse(sampleResponse(), responseOptions{AllowHeaders: []string{"Good", "bad name"}}); err == nil || !strings.Contains(err.Error(), "AllowHeaders[1]") {
		t.Errorf("bad header name: err = %v, want one naming AllowHeaders[1]", err)
	}
}

func TestResponseOversized(t *testing.T) {
	r := sampleResponse()
	r.Body = bytes.Repeat([]byte("x"), 100)
	for _, limit := range []int{99, 50} {
		got, blob, _ := roundTrip(t, r, responseOptions{MaxBytes: limit})
		if !got.Oversized || got.Body != nil || got.Status != 201 || got.ResourceID != "order-42" || got.Header.Get("Location") != "/orders/42" {
			t.Errorf("limit %d: %+v", limit, got)
		}
		if bytes.Contains(blob, r.Body) {
			t.Errorf("limit %d: the body was stored", limit)
		}
	}
	if got, _, _ := roundTrip(t, r, responseOptions{MaxBytes: 100}); got.Oversized || len(got.Body) != 100 {
		t.Errorf("at the limit: oversized=%v, %d bytes", got.Oversized, len(got.Body))
	}
	// The default limit.
	r.Body = bytes.Repeat([]byte("y"), DefaultMaxResponseBytes)
	if got, _, _ := roundTrip(t, r, responseOptions{}); got.Oversized {
		t.Error("default limit: a body of exactly DefaultMaxResponseBytes was dropped")
	}
	r.Body = append(r.Body, 'y')
	if got, _, _ := roundTrip(t, r, responseOptions{}); !got.Oversized {
		t.Error("default limit: a body of DefaultMaxResponseBytes+1 was stored")
	}
	// Already marked oversized by the capture (which stopped buffering).
	r = sampleResponse()
	r.Oversized = true
	if got, _, _ := roundTrip(t, r, responseOptions{}); !got.Oversized || got.Body != nil {
		t.Errorf("pre-marked oversized: %+v", got)
	}
	if _, _, err := encodeResponse(r, responseOptions{MaxBytes: -1}); err == nil || !strings.Contains(err.Error(), "MaxBytes") {
		t.Errorf("negative MaxBytes: err = %v", err)
	}
}

func TestResponseRedaction(t *testing.T) {
	var calls []string
	opt := responseOptions{
		MaxBytes: 40,
		Redact: func(status int, h http.Header, body []byte) []byte {
			calls = append(calls, string(body))
			if status != 201 {
				t.Errorf("Redact got status %d", status)
			}
			if loc := h["Location"]; len(loc) == 1 {
				loc[0] = "/orders/[redacted]" // in place: h is the hook's own copy
			}
			return bytes.ReplaceAll(body, []byte("tok_live_123"), []byte("[redacted]"))
		},
	}
	r := sampleResponse()
	r.Body = []byte(`{"id":42,"card":"tok_live_123"}`)
	got, blob, _ := roundTrip(t, r, opt)
	if string(got.Body) != `{"id":42,"card":"[redacted]"}` || got.Header.Get("Location") != "/orders/[redacted]" {
		t.Errorf("redacted: %s %v", got.Body, got.Header)
	}
	if bytes.Contains(blob, []byte("tok_live_123")) || bytes.Contains(blob, []byte("/orders/42")) {
		t.Error("the blob holds what Redact removed")
	}
	if r.Header.Get("Location") != "/orders/42" {
		t.Error("Redact changed the caller's headers")
	}
	// An oversized body is not passed to Redact, but the headers still are.
	calls = nil
	r.Body = bytes.Repeat([]byte("z"), 41)
	got, _, _ = roundTrip(t, r, opt)
	if len(calls) != 1 || calls[0] != "" || !got.Oversized || got.Header.Get("Location") != "/orders/[redacted]" {
		t.Errorf("oversized: calls %q, %+v", calls, got)
	}
	// The redacted body counts against the limit.
	opt.Redact = func(_ int, _ http.Header, body []byte) []byte { return append(body, bytes.Repeat([]byte("!"), 31)...) }
	r.Body = []byte("short body")
	if got, _, _ = roundTrip(t, r, opt); !got.Oversized {
		t.Errorf("redaction grew the body past MaxBytes but it was stored: %+v", got)
	}
}

func TestResponseSealed(t *testing.T) {
	k1, k2 := key(1, 32), key(2, 32)
	s1, _ := NewAESGCM("k1", map[string][]byte{"k1": k1})
	r := sampleResponse()
	r.Body = []byte(`{"card":"tok_live_123"}`)
	opt := responseOptions{Sealer: s1, Record: []byte("t1|alice|POST /pay|key-1")}
	got, blob, keyID := roundTrip(t, r, opt)
	if keyID != "k1" || blob[1] != flagSealed {
		t.Errorf("sealed: keyID %q, flags %#x", keyID, blob[1])
	}
	if !bytes.Equal(got.Body, r.Body) || got.ResourceID != "order-42" {
		t.Errorf("sealed round trip: %+v", got)
	}
	for _, secret := range []string{"tok_live_123", "order-42", "/orders/42"} {
		if bytes.Contains(blob, []byte(secret)) {
			t.Errorf("sealed blob contains %q in plain text", secret)
		}
	}

	// After rotation to k2 the k1 blob still opens; new blobs use k2.
	s2, _ := NewAESGCM("k2", map[string][]byte{"k1": k1, "k2": k2})
	opt2 := opt
	opt2.Sealer = s2
	if got, err := decodeResponse(blob, keyID, opt2); err != nil || !bytes.Equal(got.Body, r.Body) {
		t.Errorf("k1 blob after rotation: %v", err)
	}
	if _, _, k := roundTrip(t, r, opt2); k != "k2" {
		t.Errorf("after rotation new blob keyID %q, want k2", k)
	}

	// Bound to the record: copied to another record, it fails to open.
	other := opt
	other.Record = []byte("t1|mallory|POST /pay|key-1")
	if _, err := decodeResponse(blob, keyID, other); !errors.Is(err, ErrOpenFailed) {
		t.Errorf("other record: err = %v, want ErrOpenFailed", err)
	}
	// Flipping the sealed flag off turns the ciphertext into a "plain" blob
	// with a key ID: refused, never parsed as plain.
	plain := append([]byte(nil), blob...)
	plain[1] = 0
	if _, err := decodeResponse(plain, keyID, opt); !errors.Is(err, errCorruptResponse) {
		t.Errorf("flag flipped: err = %v", err)
	}
	pblob, _, _ := encodeResponse(r, responseOptions{})
	if _, err := decodeResponse(pblob, "k1", opt); !errors.Is(err, errCorruptResponse) {
		t.Errorf("plain blob stored with a key ID: err = %v", err)
	}
	if _, err := decodeResponse(blob, "", opt); !errors.Is(err, errCorruptResponse) {
		t.Errorf("sealed without key ID: err = %v", err)
	}
	if _, err := decodeResponse(blob, keyID, responseOptions{}); err == nil || !strings.Contains(err.Error(), "no Sealer") {
		t.Errorf("no Sealer: err = %v", err)
	}
	if _, err := decodeResponse(blob, "k9", opt); !errors.Is(err, ErrUnknownKeyID) {
		t.Errorf("unknown key ID: err = %v", err)
	}
	// Plain blobs written before encryption was enabled stay readable.
	pblob2, pk, _ := encodeResponse(r, responseOptions{})
	if got, err := decodeResponse(pblob2, pk, opt); err != nil || !bytes.Equal(got.Body, r.Body) {
		t.Errorf("plain blob with a Sealer configured: %v", err)
	}
	// Sealing needs the record identity.
	if _, _, err := encodeResponse(r, responseOptions{Sealer: s1}); err == nil || !strings.Contains(err.Error(), "Record") {
		t.Errorf("sealed without Record: err = %v", err)
	}
}

func TestResponseCorrupt(t *testing.T) {
	blob, _, err := encodeResponse(sampleResponse(), responseOptions{AllowHeaders: []string{"Link", "Location"}})
	if err != nil {
		t.Fatal(err)
	}
	// Every truncation and a trailing byte are refused.
	for n := 0; n < len(blob); n++ {
		if _, err := decodeResponse(blob[:n], "", responseOptions{}); !errors.Is(err, errCorruptResponse) {
			t.Fatalf("truncated to %d bytes: err = %v", n, err)
		}
	}
	if _, err := decodeResponse(append(append([]byte(nil), blob...), 0), "", responseOptions{}); !errors.Is(err, errCorruptResponse) {
		t.Errorf("trailing byte: err = %v", err)
	}
	bad := map[string][]byte{
		"version 2":      append([]byte{2}, blob[1:]...),
		"unknown flags":  append([]byte{1, 4}, blob[2:]...),
		"status 0":       {1, 0, 0, 0, 0, 0, 0},
		"status 1000":    {1, 0, 0xe8, 0x07, 0, 0, 0, 0},
		"oversized 2":    {1, 0, 200, 1, 2, 0, 0, 0},
		"huge length":    {1, 0, 200, 1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"huge count":     {1, 0, 200, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f},
		"bad varint":     {1, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01},
		"empty":          nil,
		"only a version": {1},
	}
	for name, b := range bad {
		if _, err := decodeResponse(b, "", responseOptions{}); !errors.Is(err, errCorruptResponse) {
			t.Errorf("%s: err = %v, want errCorruptResponse", name, err)
		}
	}
	// Invalid status on encode.
	if _, _, err := encodeResponse(storedResponse{Status: 42}, responseOptions{}); err == nil {
		t.Error("status 42 encoded")
	}
}

// FuzzDecodeResponse: no input panics or allocates past its own size.
func FuzzDecodeResponse(f *testing.F) {
	blob, _, _ := encodeResponse(sampleResponse(), responseOptions{AllowHeaders: []string{"Link", "Location"}})
	f.Add(blob)
	f.Fuzz(func(_ *testing.T, b []byte) {
		_, _ = decodeResponse(b, "", responseOptions{})
	})
}

// BenchmarkResponse: encoding and decoding a 1 KiB response, plain and sealed.
func BenchmarkResponse(b *testing.B) {
	r := sampleResponse()
	r.Body = bytes.Repeat([]byte("a"), 1024)
	s, _ := NewAESGCM("k1", map[string][]byte{"k1": key(1, 32)})
	for _, c := range []struct {
		name string
		opt  responseOptions
	}{{"plain", responseOptions{}}, {"sealed", responseOptions{Sealer: s, Record: []byte("t|p|POST /x|k")}}} {
		b.Run(c.name+"/encode", func(b *testing.B) {
			for b.Loop() {
				if _, _, err := encodeResponse(r, c.opt); err != nil {
					b.Fatal(err)
				}
			}
		})
		blob, keyID, _ := encodeResponse(r, c.opt)
		b.Run(c.name+"/decode", func(b *testing.B) {
			for b.Loop() {
				if _, err := decodeResponse(blob, keyID, c.opt); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
