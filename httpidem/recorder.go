package httpidem

import (
	"bytes"
	"net/http"
	"strconv"
)

// recorder is the buffered http.ResponseWriter the handler writes to: its
// response reaches the client only after the record's COMMIT (or after a
// failure is marked), so a client never sees a response whose effects
// could still roll back.
type recorder struct {
	header      http.Header
	status      int
	body        bytes.Buffer
	wroteHeader bool
	panicked    bool
}

func newRecorder() *recorder { return &recorder{header: http.Header{}, status: http.StatusOK} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.wroteHeader || status < 200 { // 1xx informational answers are not buffered
		return
	}
	r.status, r.wroteHeader = status, true
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wroteHeader = true
	return r.body.Write(b)
}

// Flush is a no-op: the response is sent after COMMIT.
func (r *recorder) Flush() {}

// writeTo sends the buffered response.
func (r *recorder) writeTo(w http.ResponseWriter) {
	h := w.Header()
	for k, vs := range r.header {
		h[k] = vs
	}
	h.Set("Content-Length", strconv.Itoa(r.body.Len()))
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
