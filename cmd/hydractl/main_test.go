package main

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hydra-engine/hydra-engine/transport"
)

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func isUsage(err error) bool {
	var ue usageError
	return errors.As(err, &ue)
}

func TestTokenPayload(t *testing.T) {
	// §10: the E1 PREFILL payload, tokens 1..5.
	want := unhex(t, "01 00 00 00 02 00 00 00 03 00 00 00 04 00 00 00 05 00 00 00")
	for _, in := range []string{"1,2,3,4,5", " 1, 2 ,3,4 , 5 "} {
		if got, err := tokenPayload(in); err != nil || !bytes.Equal(got, want) {
			t.Errorf("tokenPayload(%q) = % x, %v", in, got, err)
		}
	}
	if got, err := tokenPayload("4294967295"); err != nil || !bytes.Equal(got, []byte{0xff, 0xff, 0xff, 0xff}) {
		t.Errorf("max id: % x, %v", got, err)
	}
	for _, in := range []string{"", "1,,2", "-1", "4294967296", "x", "1;2"} {
		if _, err := tokenPayload(in); !isUsage(err) {
			t.Errorf("tokenPayload(%q) err = %v, want a usage error", in, err)
		}
	}
}

func TestPrefillPayload(t *testing.T) {
	for _, c := range []struct {
		name                   string
		set                    []string
		messages, text, tokens string
		want                   string
		wantErr                string
	}{
		{name: "text", set: []string{"text"}, text: `say "hi"`,
			want: `{"messages":[{"role":"user","content":"say \"hi\""}]}`},
		{name: "array", set: []string{"messages"}, messages: ` [ {"role":"system","content":"be brief"},
			{"role":"user","content":"hi"} ] `,
			want: `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}`},
		{name: "object", set: []string{"messages"}, messages: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{name: "tokens", set: []string{"tokens"}, tokens: "65,66", want: "A\x00\x00\x00B\x00\x00\x00"},
		{name: "none", wantErr: "exactly one"},
		{name: "two", set: []string{"text", "tokens"}, text: "a", tokens: "1", wantErr: "exactly one"},
		{name: "bad json", set: []string{"messages"}, messages: `[{"role":`, wantErr: "not valid JSON"},
		{name: "object without messages", set: []string{"messages"}, messages: `{"model":"m"}`, wantErr: `no "messages"`},
		{name: "scalar", set: []string{"messages"}, messages: `"hi"`, wantErr: "JSON array"},
	} {
		set := map[string]bool{}
		for _, f := range c.set {
			set[f] = true
		}
		got, err := prefillPayload(set, c.messages, c.text, c.tokens)
		if c.wantErr != "" {
			if !isUsage(err) || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s: err = %v, want a usage error containing %q", c.name, err, c.wantErr)
			}
			continue
		}
		if err != nil || string(got) != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.name, got, err, c.want)
		}
	}
}

func TestOtherPayloads(t *testing.T) {
	if got := string(decodePayload(10)); got != `{"n_predict":10,"messages":null}` {
		t.Errorf("decodePayload = %s", got)
	}
	// §10: SWAP_QUANT payload.
	want := unhex(t, "0c 00 51 36 5f 4b 2f 65 78 70 65 72 74 73 62 6c 6b 5c 2e 35 5c 2e 66 66 6e 5f 2e 2a 5f 65 78 70 73")
	if got, err := swapQuantPayload("Q6_K/experts", `blk\.5\.ffn_.*_exps`); err != nil || !bytes.Equal(got, want) {
		t.Errorf("swapQuantPayload = % x, %v", got, err)
	}
	if _, err := swapQuantPayload(strings.Repeat("k", 1<<16), "p"); !isUsage(err) {
		t.Errorf("64 KiB quant key: err = %v", err)
	}
	if got, err := configurePayload(`{"state_chunk_size":2097152}`); err != nil || string(got) != `{"state_chunk_size":2097152}` {
		t.Errorf("configurePayload = %q, %v", got, err)
	}
	if got, err := configurePayload(" "); err != nil || len(got) != 0 {
		t.Errorf("empty configure = %q, %v", got, err)
	}
	if _, err := configurePayload("{state_chunk_size:1}"); !isUsage(err) {
		t.Errorf("bad configure JSON: err = %v", err)
	}
	if got := gbps(2e9, 2); got != "1.00 GB/s" {
		t.Errorf("gbps = %q", got)
	}
}

func TestRunUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		code int
		err  string
	}{
		{args: nil, code: 2, err: "usage: hydractl"},
		{args: []string{"--bogus", "info"}, code: 2, err: "flag provided but not defined"},
		{args: []string{"info", "--bogus"}, code: 2, err: "info: flag provided but not defined: -bogus\nRun 'hydractl info --help'"},
		{args: []string{"frobnicate"}, code: 2, err: `unknown command "frobnicate"`},
		{args: []string{"info", "extra"}, code: 2, err: `unexpected argument "extra"`},
		{args: []string{"meta", "--slot", "-1"}, code: 2, err: "--slot must be >= 0"},
		{args: []string{"configure"}, code: 2, err: "want one JSON argument"},
		{args: []string{"configure", "{}", "{}"}, code: 2, err: "want one JSON argument, got 2"},
		{args: []string{"prefill", "--slot", "0"}, code: 2, err: "exactly one of"},
		{args: []string{"decode", "--slot", "0", "--n", "-3"}, code: 2, err: "--n must be >= 0"},
		{args: []string{"state"}, code: 2, err: "get or put"},
		{args: []string{"state", "copy"}, code: 2, err: `unknown state subcommand "copy"`},
		{args: []string{"state", "get", "--slot", "0"}, code: 2, err: "needs -o FILE"},
		{args: []string{"state", "put", "--slot", "1"}, code: 2, err: "needs -i FILE"},
		{args: []string{"expert-mode", "Solo"}, code: 2, err: "want solo or combined"},
		{args: []string{"swap-quant", "Q6_K"}, code: 2, err: "want KEY and PATTERN"},
		{args: []string{"migrate", "--slot", "0"}, code: 2, err: "needs --to URL"},
		{args: []string{"migrate", "--slot", "0", "--to", "tcp://x:1", "--to-slot", "-1"}, code: 2, err: "--to-slot must be >= 0"},
		{args: []string{"bench", "--slot", "0", "--rounds", "0"}, code: 2, err: "--rounds must be >= 1"},
		{args: []string{"--addr", "ftp://x:1", "info"}, code: 1, err: `unknown scheme "ftp"`},
	} {
		var stdout, stderr bytes.Buffer
		code := run(c.args, &stdout, &stderr)
		if code != c.code || !strings.Contains(stderr.String(), c.err) {
			t.Errorf("hydractl %q: exit %d, stderr %q; want exit %d and %q", c.args, code, stderr.String(), c.code, c.err)
		}
		if stdout.Len() != 0 {
			t.Errorf("hydractl %q wrote to stdout: %q", c.args, stdout.String())
		}
	}
	var stdout bytes.Buffer
	if code := run([]string{"help"}, &stdout, io.Discard); code != 0 || !strings.Contains(stdout.String(), "state put") {
		t.Errorf("help: exit %d, %q", code, stdout.String())
	}
}

// fake is a Hydra RPC engine on a Unix socket with canned replies; it
// records the ops it is sent.
type fake struct {
	addr      string
	blob      []byte
	metaNPast int // n_past of STATE_META replies
	getNPast  int // n_past of STATE_GET replies

	mu  sync.Mutex
	ops []string // "OP key", in order
}

// fakeEngine starts a fake whose slots all hold blob at n_past 3.
func fakeEngine(t *testing.T, blob []byte) string {
	return startFake(t, &fake{blob: blob, metaNPast: 3, getNPast: 3}).addr
}

func startFake(t *testing.T, f *fake) *fake {
	t.Helper()
	path := filepath.Join(t.TempDir(), "e.sock")
	l, err := transport.Listen("unix://" + path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go f.serve(conn)
		}
	}()
	f.addr = "unix://" + path
	return f
}

// received returns the ops the fake was sent.
func (f *fake) received() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ops)
}

func (f *fake) serve(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for {
		h, err := transport.ReadRequestHeader(br)
		if err != nil {
			return
		}
		key, trace, err := transport.ReadKeyTrace(br, h)
		if err != nil {
			return
		}
		f.mu.Lock()
		f.ops = append(f.ops, h.Op.String()+" "+key)
		f.mu.Unlock()
		payload := make([]byte, h.PayloadLen)
		if _, err := io.ReadFull(br, payload); err != nil {
			return
		}
		blob := f.blob
		status, meta, body := transport.StatusOK, "", []byte(nil)
		switch {
		case key == "9":
			status, meta = transport.StatusNotFound, `{"error":"invalid slot ID"}`
		case h.Op == transport.OpInfo:
			meta = fmt.Sprintf(`{"engine":"fake","trace":%q}`, trace)
		case h.Op == transport.OpStateMeta:
			meta = fmt.Sprintf(`{"slot_id":%s,"n_past":%d,"state_size":%d,"is_processing":false,"is_transferring":false}`, key, f.metaNPast, len(blob))
		case h.Op == transport.OpStateGet:
			meta, body = fmt.Sprintf(`{"n_past":%d,"state_size":%d}`, f.getNPast, len(blob)), blob
		case h.Op == transport.OpStatePut:
			meta = fmt.Sprintf(`{"restored":true,"bytes":%d,"crc":%d}`, len(payload), crc32.ChecksumIEEE(payload))
		case h.Op == transport.OpPrefill:
			meta, body = fmt.Sprintf(`{"payload":%q}`, payload), blob
		case h.Op == transport.OpDecode:
			meta = `{"tokens_generated":2,"n_past":5,"stop_reason":"length","text":"Hi"}`
			body = transport.AppendDecodeFrame(nil, transport.DecodeFrame{TokenID: 72, Logprob: -0.5})
			body = transport.AppendDecodeFrame(body, transport.DecodeFrame{TokenID: 105, Logprob: -0.25, Final: true})
		default:
			meta = fmt.Sprintf(`{"op":%q,"payload":%q}`, h.Op, payload)
		}
		var b bytes.Buffer
		transport.WriteResponseHeader(&b, status, []byte(meta), uint64(len(body)))
		b.Write(body)
		if _, err := conn.Write(b.Bytes()); err != nil {
			return
		}
	}
}

func TestRunAgainstFakeEngine(t *testing.T) {
	blob := bytes.Repeat([]byte("kv-state"), 1<<17) // 1 MiB
	addr := fakeEngine(t, blob)
	dir := t.TempDir()
	blobFile := filepath.Join(dir, "slot0.blob")

	hydractl := func(args ...string) (int, string, string) {
		var stdout, stderr bytes.Buffer
		code := run(args, &stdout, &stderr)
		return code, stdout.String(), stderr.String()
	}

	// Global flags before and after the command.
	if code, out, errOut := hydractl("--addr", addr, "--trace", "t-1", "info"); code != 0 || out != `{"engine":"fake","trace":"t-1"}`+"\n" {
		t.Fatalf("info: %d %q %q", code, out, errOut)
	}
	if code, out, _ := hydractl("info", "--addr", addr); code != 0 || !strings.Contains(out, `"trace":""`) {
		t.Fatalf("info with --addr after the command: %d %q", code, out)
	}

	code, out, errOut := hydractl("--addr", addr, "state", "get", "--slot", "0", "-o", blobFile)
	if code != 0 || out != `{"n_past":3,"state_size":1048576}`+"\n" || !strings.Contains(errOut, "GB/s") {
		t.Fatalf("state get: %d %q %q", code, out, errOut)
	}
	if got, err := os.ReadFile(blobFile); err != nil || !bytes.Equal(got, blob) {
		t.Fatalf("saved blob differs (%d bytes, %v)", len(got), err)
	}

	code, out, errOut = hydractl("--addr", addr, "state", "put", "--slot", "1", "-i", blobFile)
	want := fmt.Sprintf(`{"restored":true,"bytes":%d,"crc":%d}`+"\n", len(blob), crc32.ChecksumIEEE(blob))
	if code != 0 || out != want || !strings.Contains(errOut, "GB/s") {
		t.Fatalf("state put: %d %q %q", code, out, errOut)
	}

	// A non-OK status: name and message on stderr, exit 1, nothing on stdout,
	// and no file left behind.
	missing := filepath.Join(dir, "missing.blob")
	code, out, errOut = hydractl("--addr", addr, "state", "get", "--slot", "9", "-o", missing)
	if code != 1 || out != "" || errOut != "hydractl: state get: NOT_FOUND: invalid slot ID\n" {
		t.Fatalf("state get of a missing slot: %d %q %q", code, out, errOut)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file created for a failed get: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Fatalf("stray files: %v", entries)
	}

	code, out, errOut = hydractl("--addr", addr, "prefill", "--slot", "2", "--text", "Hello", "-o", filepath.Join(dir, "p.blob"))
	if code != 0 || !strings.Contains(out, `"payload":"{\"messages\":[{\"role\":\"user\",\"content\":\"Hello\"}]}"`) {
		t.Fatalf("prefill: %d %q %q", code, out, errOut)
	}
	if got, _ := os.ReadFile(filepath.Join(dir, "p.blob")); !bytes.Equal(got, blob) {
		t.Fatal("prefill blob not saved")
	}
	if code, _, errOut = hydractl("--addr", addr, "prefill", "--slot", "0", "--tokens", "1,2"); code != 0 || !strings.Contains(errOut, "not saved") {
		t.Fatalf("prefill without -o: %d %q", code, errOut)
	}

	code, out, errOut = hydractl("--addr", addr, "decode", "--slot", "2", "--n", "2")
	if code != 0 || !strings.Contains(out, `"text":"Hi"`) || !strings.Contains(errOut, "2 token frames") || !strings.Contains(errOut, "\nHi") {
		t.Fatalf("decode: %d %q %q", code, out, errOut)
	}

	code, out, _ = hydractl("--addr", addr, "swap-quant", "Q6_K", "blk")
	if code != 0 || out != `{"op":"SWAP_QUANT","payload":"\x04\x00Q6_Kblk"}`+"\n" {
		t.Fatalf("swap-quant: %d %q", code, out)
	}
	code, out, _ = hydractl("--addr", addr, "expert-mode", "combined")
	if code != 0 || out != `{"op":"SET_EXPERT_MODE","payload":"combined"}`+"\n" {
		t.Fatalf("expert-mode: %d %q", code, out)
	}
	code, out, _ = hydractl("--addr", addr, "configure", `{"state_chunk_size":65536}`)
	if code != 0 || out != `{"op":"CONFIGURE","payload":"{\"state_chunk_size\":65536}"}`+"\n" {
		t.Fatalf("configure: %d %q", code, out)
	}
}
