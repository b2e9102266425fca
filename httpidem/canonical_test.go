package httpidem

import (
	"errors"
	"strings"
	"testing"
)

const jsonCT = "application/json"

func mustCanon(t *testing.T, ct, body string, ignore ...string) string {
	t.Helper()
	v, canon, err := canonicalBody(ct, []byte(body), ignore)
	if err != nil {
		t.Fatalf("canonicalBody(%q, %q, %q): %v", ct, body, ignore, err)
	}
	if v != CanonicalVersion {
		t.Fatalf("version = %d, want CanonicalVersion %d", v, CanonicalVersion)
	}
	return string(canon)
}

func TestCanonicalBodyJSONVariantsEqual(t *testing.T) {
	variants := []string{
		`{"amount":100,"currency":"EUR","items":[{"sku":"a","qty":1},{"sku":"b","qty":2}]}`,
		`{ "currency" : "EUR", "amount": 100,
		   "items": [ {"qty":1, "sku":"a"}, {"qty": 2,"sku": "b"} ] }`,
		"\n\t{\"items\":[{\"sku\":\"a\",\"qty\":1.0},{\"sku\":\"b\",\"qty\":2e0}],\"amount\":1.00e2,\"currency\":\"\\u0045UR\"}\r\n",
	}
	want := `{"amount":100,"currency":"EUR","items":[{"qty":1,"sku":"a"},{"qty":2,"sku":"b"}]}`
	for _, ct := range []string{jsonCT, "application/json; charset=utf-8", "Application/JSON", "application/problem+json", "application/vnd.api+json;v=2"} {
		for i, b := range variants {
			if got := mustCanon(t, ct, b); got != want {
				t.Errorf("%s variant %d: got %s, want %s", ct, i, got, want)
			}
		}
	}
}

func TestCanonicalBodyNumbersPerJCS(t *testing.T) {
	cases := map[string]string{
		`1.0`:        `1`,
		`1`:          `1`,
		`-0`:         `0`,
		`1E30`:       `1e+30`,
		`4.50`:       `4.5`,
		`2e-3`:       `0.002`,
		`0.000001`:   `0.000001`,
		`0.0000001`:  `1e-7`,
		`100e-2`:     `1`,
		`[10.10,-5]`: `[10.1,-5]`,
		// Beyond 2^53 JCS keeps double precision only (documented).
		`9007199254740993`: `9007199254740992`,
	}
	for in, want := range cases {
		if got := mustCanon(t, jsonCT, in); got != want {
			t.Errorf("%s: got %s, want %s", in, got, want)
		}
	}
	if mustCanon(t, jsonCT, `{"amount":10}`) == mustCanon(t, jsonCT, `{"amount":10.5}`) {
		t.Error("different amounts canonicalized equal")
	}
}

func TestCanonicalBodyIgnore(t *testing.T) {
	base := `{"amount":100,"meta":{"traceId":"t1","note":"n"},"traceId":"x","lines":[{"traceId":"l1","sku":"a"}]}`
	other := `{"traceId":"y","lines":[{"sku":"a","traceId":"l2"}],"amount":100,"meta":{"note":"n","traceId":"t2"}}`

	// By name: removed at every depth, also inside arrays.
	byName := mustCanon(t, jsonCT, base, "traceId")
	if want := `{"amount":100,"lines":[{"sku":"a"}],"meta":{"note":"n"}}`; byName != want {
		t.Errorf("by name: got %s, want %s", byName, want)
	}
	if got := mustCanon(t, jsonCT, other, "traceId"); got != byName {
		t.Errorf("by name: variants differ: %s vs %s", got, byName)
	}
	// Without the ignore list the two differ.
	if mustCanon(t, jsonCT, base) == mustCanon(t, jsonCT, other) {
		t.Error("bodies with different traceIds equal without an ignore list")
	}

	// By pointer: only that location.
	byPtr := mustCanon(t, jsonCT, base, "/meta/traceId")
	if want := `{"amount":100,"lines":[{"sku":"a","traceId":"l1"}],"meta":{"note":"n"},"traceId":"x"}`; byPtr != want {
		t.Errorf("by pointer: got %s, want %s", byPtr, want)
	}
	if got := mustCanon(t, jsonCT, base, "/lines/0/traceId", "/traceId", "/meta/traceId"); got != byName {
		t.Errorf("pointers into arrays: got %s, want %s", got, byName)
	}
	// Escapes: "~1" is "/", "~0" is "~".
	if got, want := mustCanon(t, jsonCT, `{"a/b":1,"c~d":2,"e":3}`, "/a~1b", "/c~0d"), `{"e":3}`; got != want {
		t.Errorf("escaped pointers: got %s, want %s", got, want)
	}
	// Missing paths, array-element targets and scalars in the way are no-ops.
	const arr = `{"a":[1,2],"s":"x"}`
	for _, p := range []string{"/nope", "/a/0", "/a/7/x", "/a/01/x", "/s/x", "/a/-/x"} {
		if got := mustCanon(t, jsonCT, arr, p); got != arr {
			t.Errorf("pointer %s: got %s, want unchanged %s", p, got, arr)
		}
	}
	// The rest of the document is canonical after a removal too (UTF-16 order,
	// JCS string escapes, no HTML escaping).
	// U+FF61 sorts after U+1F600 in UTF-16 code units (0xFF61 > 0xD83D) but
	// before it in UTF-8 bytes; encoding/json would write U+2028 as \u2028.
	got := mustCanon(t, jsonCT, `{"\uff61":"<&>\u2028","\ud83d\ude00":1,"z":2,"x":0}`, "x")
	if want := "{\"z\":2,\"\U0001F600\":1,\"\uff61\":\"<&>\u2028\"}"; got != want {
		t.Errorf("after removal: got %s, want %s", got, want)
	}
	// Non-JSON bodies ignore the list.
	if got := mustCanon(t, "text/plain", `{"traceId":1}`, "traceId"); got != `{"traceId":1}` {
		t.Errorf("text/plain with ignore: got %s", got)
	}
}

func TestCanonicalBodyNested(t *testing.T) {
	a := `{"o":{"z":[{"b":{"y":1,"x":[true,null,{"k2":"v","k1":false}]},"a":0}],"a":"s"}}`
	b := `{"o":{"a":"s","z":[{"a":0,"b":{"x":[true,null,{"k1":false,"k2":"v"}],"y":1.0}}]}}`
	want := `{"o":{"a":"s","z":[{"a":0,"b":{"x":[true,null,{"k1":false,"k2":"v"}],"y":1}}]}}`
	if ga, gb := mustCanon(t, jsonCT, a), mustCanon(t, jsonCT, b); ga != want || gb != want {
		t.Errorf("nested: got %s and %s, want %s", ga, gb, want)
	}
	// Array order is significant.
	if mustCanon(t, jsonCT, `[1,2]`) == mustCanon(t, jsonCT, `[2,1]`) {
		t.Error("array order ignored")
	}
}

func TestCanonicalBodyMalformed(t *testing.T) {
	bad := []string{
		`{"a":1`,
		`{"a":1}}`,
		`{"a":1} x`,
		`{a:1}`,
		`{"a":1,"a":2}`, // duplicate member (I-JSON)
		`{"a":01}`,
		`{"a":NaN}`,
		"{\"a\":\"\xff\"}", // invalid UTF-8
		`{"a":"\ud800"}`,   // lone surrogate
		strings.Repeat("[", 10001) + strings.Repeat("]", 10001), // deeper than the library allows,
	}
	for _, b := range bad {
		for _, ignore := range [][]string{nil, {"a"}} {
			_, _, err := canonicalBody(jsonCT, []byte(b), ignore)
			if !errors.Is(err, errMalformedJSON) {
				t.Errorf("%.40q ignore=%q: err = %v, want errMalformedJSON", b, ignore, err)
			}
		}
	}
	// Not JSON by media type: the same bytes are a valid body.
	if got := mustCanon(t, "text/plain", `{"a":1`); got != `{"a":1` {
		t.Errorf("text/plain: got %q", got)
	}
}

func TestCanonicalBodyEmptyAndNonJSON(t *testing.T) {
	for _, b := range []string{"", " \r\n\t"} {
		if got := mustCanon(t, jsonCT, b); got != "" {
			t.Errorf("empty JSON body %q: got %q, want empty", b, got)
		}
	}
	raw := "a=1&b=2 \n"
	for _, ct := range []string{"", "application/x-www-form-urlencoded", "text/json-ish", "application/jsonx", "application/+json", "json", "multipart/form-data; boundary=x"} {
		if got := mustCanon(t, ct, raw); got != raw {
			t.Errorf("%q: got %q, want the bytes unchanged", ct, got)
		}
	}
}

func TestValidateIgnore(t *testing.T) {
	if err := validateIgnore([]string{"traceId", "/a/b", "/a~0~1", "/", "/a//b"}); err != nil {
		t.Errorf("valid list: %v", err)
	}
	for _, bad := range [][]string{{""}, {"ok", "/a~2"}, {"/a~"}} {
		err := validateIgnore(bad)
		if err == nil {
			t.Errorf("%q: no error", bad)
			continue
		}
		if !strings.Contains(err.Error(), "ignore entry") {
			t.Errorf("%q: error %q does not name the entry", bad, err)
		}
		if _, _, err := canonicalBody(jsonCT, []byte(`{"a":1}`), bad); err == nil {
			t.Errorf("canonicalBody with ignore %q: no error", bad)
		}
	}
}

// TestCanonicalBodyVersion1Frozen pins version 1's output: a change here
// means a new CanonicalVersion, or retries recorded under version 1 would
// turn into fingerprint conflicts.
func TestCanonicalBodyVersion1Frozen(t *testing.T) {
	frozen := []struct {
		ct, body string
		ignore   []string
		want     string
	}{
		{jsonCT, `{"b": [1.50, "x"], "a": {"d": null, "c": true}}`, nil, `{"a":{"c":true,"d":null},"b":[1.5,"x"]}`},
		{jsonCT, `{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001]}`, nil, `{"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27]}`},
		{jsonCT, `{"s":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/"}`, nil, "{\"s\":\"\u20ac$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"},
		{jsonCT, `{"traceId":"t","x":{"traceId":"u","y":2}}`, []string{"traceId"}, `{"x":{"y":2}}`},
		{jsonCT, `{"traceId":"t","x":{"traceId":"u","y":2}}`, []string{"/x/traceId"}, `{"traceId":"t","x":{"y":2}}`},
		{"application/merge-patch+json", `{"\u00e9":1,"e":2}`, nil, "{\"e\":2,\"\u00e9\":1}"},
		{jsonCT, "  ", nil, ``},
		{"text/plain", " raw  body ", []string{"x"}, ` raw  body `},
	}
	for _, f := range frozen {
		got, err := canonicalBodyVersion(1, f.ct, []byte(f.body), f.ignore)
		if err != nil {
			t.Fatalf("%s %s: %v", f.ct, f.body, err)
		}
		if string(got) != f.want {
			t.Errorf("version 1 of %s %s (ignore %q) = %s, want %s", f.ct, f.body, f.ignore, got, f.want)
		}
	}
}

func TestCanonicalBodyVersionSelection(t *testing.T) {
	body := []byte(`{"b":1,"a":2}`)
	v, cur, err := canonicalBody(jsonCT, body, nil)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := canonicalBodyVersion(v, jsonCT, body, nil)
	if err != nil || string(stored) != string(cur) {
		t.Fatalf("canonicalBodyVersion(%d) = %s, %v; want %s", v, stored, err, cur)
	}
	for _, unknown := range []int{0, -1, CanonicalVersion + 1} {
		if _, err := canonicalBodyVersion(unknown, jsonCT, body, nil); !errors.Is(err, errUnknownCanonicalVersion) {
			t.Errorf("version %d: err = %v, want errUnknownCanonicalVersion", unknown, err)
		}
	}
}

// BenchmarkCanonicalBody: the per-request cost of a ~1 KiB JSON body, without
// and with an ignore list (which adds a decode and a second JCS pass).
func BenchmarkCanonicalBody(b *testing.B) {
	var sb strings.Builder
	sb.WriteString(`{"traceId":"0af7651916cd43dd8448eb211c80319c","currency":"EUR","amount":1999,"lines":[`)
	for i := 0; i < 12; i++ {
		if i > 0 {
			sb.WriteString(",")
		}
		sb.WriteString(`{"sku":"SKU-000123","qty":2,"price":9.95,"note":"gift wrap, please"}`)
	}
	sb.WriteString(`]}`)
	body := []byte(sb.String())
	for _, c := range []struct {
		name   string
		ignore []string
	}{{"plain", nil}, {"ignore", []string{"traceId"}}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if _, _, err := canonicalBody(jsonCT, body, c.ignore); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
