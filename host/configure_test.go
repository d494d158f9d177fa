package host

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/transport"
)

// TestConfigureErrorIsOneLine: mapstructure reports every bad key at once,
// one per line under a header; the error comes out on one line and still
// names each key.
func TestConfigureErrorIsOneLine(t *testing.T) {
	for _, c := range []struct {
		json string
		want []string
	}{
		{`{"temperature":"hot","top_k":"x"}`, []string{"'temperature'", "'top_k'"}},
		{`{"seed":-1}`, []string{"'seed'"}},
		{`{"top_k":1.5,"seed":"7","temperature":true}`, []string{"'top_k'", "'seed'", "'temperature'"}},
	} {
		_, _, err := parseConfigure([]byte(c.json), 0)
		if err == nil {
			t.Fatalf("%s: accepted", c.json)
		}
		msg := oneLine(err)
		if strings.ContainsAny(msg, "\r\n") || strings.Contains(msg, "following error") {
			t.Errorf("%s: %q is not one plain line", c.json, msg)
		}
		for _, w := range c.want {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %q does not name %s", c.json, msg, w)
			}
		}
	}
	if got := oneLine(io.EOF); got != "EOF" {
		t.Errorf("oneLine(EOF) = %q", got)
	}
}

// TestConfigureChunkSizeMustBeNumber: a string that holds digits is not a
// number (the C++ engine's get<size_t> rejects it), nor is null.
func TestConfigureChunkSizeMustBeNumber(t *testing.T) {
	for _, b := range []string{`{"state_chunk_size":"65536"}`, `{"state_chunk_size":null}`, `{"state_chunk_size":[1]}`} {
		if _, _, err := parseConfigure([]byte(b), 0); err == nil || !strings.Contains(err.Error(), "must be a number") {
			t.Errorf("%s: err = %v", b, err)
		}
	}
}

// configure runs one CONFIGURE through the handler and returns the reply's
// status and meta, and what was logged.
func configure(t *testing.T, payload string) (transport.Status, map[string]any, string) {
	t.Helper()
	var logBuf, out bytes.Buffer
	s := &Server{
		log: hclog.New(&hclog.LoggerOptions{Output: &logBuf, Level: hclog.Info}),
		tun: NewTunables(),
	}
	req := &request{key: "0", ctx: t.Context(), payload: &io.LimitedReader{R: strings.NewReader(payload), N: int64(len(payload))}}
	rp := &replier{w: bufio.NewWriter(&out)}
	if err := s.handleConfigure(req, rp); err != nil {
		t.Fatalf("%s: %v", payload, err)
	}
	rp.w.Flush()
	h, err := transport.ParseResponseHeader(out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes()[transport.ResponseHeaderSize:][:h.MetaLen], &m); err != nil {
		t.Fatalf("%s: meta: %v", payload, err)
	}
	return h.Status, m, logBuf.String()
}

// TestConfigureBadValueLogsOneLine: a CONFIGURE with several bad values logs
// one WARN line and answers ERROR with the same one-line reason.
func TestConfigureBadValueLogsOneLine(t *testing.T) {
	st, m, log := configure(t, `{"temperature":"hot","top_k":"x"}`)
	if st != transport.StatusError {
		t.Fatalf("status %v, want ERROR", st)
	}
	msg, _ := m["error"].(string)
	if strings.Contains(msg, "\n") || !strings.Contains(msg, "'temperature'") || !strings.Contains(msg, "'top_k'") {
		t.Errorf("error meta %q", msg)
	}
	lines := strings.Split(strings.TrimRight(log, "\n"), "\n")
	if len(lines) != 1 || !strings.Contains(lines[0], "[WARN]") ||
		!strings.Contains(lines[0], "CONFIGURE failed to parse config_json (slot 0): ") || !strings.Contains(lines[0], msg) {
		t.Errorf("log is not one WARN line with the reason:\n%s", log)
	}

	// A good request still logs and answers as before.
	st, m, log = configure(t, `{"state_chunk_size":1024}`)
	if st != transport.StatusOK || m["state_chunk_size_applied"] != float64(64<<10) ||
		!strings.Contains(log, "CONFIGURE state_chunk_size requested=1024 applied=65536 (slot 0)") {
		t.Errorf("good CONFIGURE: %v %v %q", st, m, log)
	}
}
