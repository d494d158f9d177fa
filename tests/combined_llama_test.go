//go:build llama

package tests

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
	"github.com/hydra-engine/hydra-engine/transport"
)

// Combined mode between two engine processes on the llama.cpp plugin, the
// CPU standing in for the peer's GPU: the peer lends its weights (in host
// memory, mapped from its model file), the head binds its experts to them.

const expertPattern = `blk\.[0-9]+\.ffn_(gate|up|down)_exps`

// greedy prefills prompt into slot 0 and decodes n tokens greedily.
func greedy(t *testing.T, c *transport.Client, prompt string, n int) []uint32 {
	t.Helper()
	mustOK(t, c, transport.OpPrefill, "0", chat(prompt))
	ids, _ := decodeIDs(t, c, "0", n)
	return ids
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	src, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	dst, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
}

// pluginMaps is the maps file of the engine's plugin process.
func pluginMaps(t *testing.T, e *engine) string {
	t.Helper()
	kids, err := enginetest.Children(e.e.Pid())
	if err != nil || len(kids) != 1 {
		t.Fatalf("the engine's children: %v %v", kids, err)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", kids[0]))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func waitInfo(t *testing.T, c *transport.Client, what string, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		// INFO is an error while the backend is down (a plugin restarting).
		if st, m, _ := call(t, c, transport.OpInfo, "", nil); st == transport.StatusOK && ok(m) {
			return m
		}
		if time.Now().After(deadline) {
			_, m, _ := call(t, c, transport.OpInfo, "", nil)
			t.Fatalf("INFO never showed %s: %v", what, m)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestLlamaCombinedEngines: a head bound to its peer's experts decodes the
// tokens it decodes solo and reads them from the peer's file; a swap on
// the peer binds it to the peer's new experts (the tokens of the peer's
// own); a restarted peer is followed; a peer whose model differs is
// refused with the reason; solo gives the head its own weights back.
func TestLlamaCombinedEngines(t *testing.T) {
	plugin, _ := llamaSetup(t)
	f16, q8 := swapModels(t)
	peerFile := filepath.Join(t.TempDir(), "peer-moe-f16.gguf") // the same bytes at another path: the head must read the peer's
	copyFile(t, f16, peerFile)
	lendPort, err := enginetest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	lend := fmt.Sprintf("127.0.0.1:%d", lendPort)
	common := []string{"--backend", plugin, "--slots", "1", "--backend-opt", "n_threads=1", "--backend-opt", "n_ctx=512"}
	startPeer := func(model string, extra ...string) *engine {
		return startEngine(t, append(append(slices.Clone(common), "--model", model, "--lend-weights", lend), extra...)...)
	}
	peer := startPeer(peerFile, "--backend-opt", "quant.q8="+q8)
	head, headHTTP := startHTTPEngine(t, append(slices.Clone(common), "--model", f16, "--combined-peer", lend)...)
	pc, hc := client(t, peer.tcp), client(t, head.tcp)

	const prompt, n = "Lend me your experts.", 12
	solo := greedy(t, hc, prompt, n)
	first := waitInfo(t, hc, "the peer's weights", func(m map[string]any) bool { return m["peer_reachable"] == true })
	if first["mode"] != "solo" || first["peer_addr"] != lend || first["peer_connected"] != true {
		t.Fatalf("the head's INFO: %v", first)
	}
	if m, _ := mustOK(t, pc, transport.OpInfo, "", nil); m["rpc_backend_active"] != true || m["lent_to_heads"] != float64(1) {
		t.Fatalf("the peer's INFO: %v", m)
	}

	m, _ := mustOK(t, hc, transport.OpSetExpertMode, "0", []byte("combined"))
	if m["mode"] != "combined" || m["peer_connected"] != true {
		t.Fatalf("SET_EXPERT_MODE combined: %v", m)
	}
	if got := greedy(t, hc, prompt, n); !slices.Equal(got, solo) {
		t.Fatalf("combined %v, solo %v", got, solo)
	}
	if maps := pluginMaps(t, head); !strings.Contains(maps, peerFile) {
		t.Fatalf("the head's plugin does not map the peer's file %s", peerFile)
	}
	if !strings.Contains(head.logs.String(), "combined mode: bound to the peer engine's weights") {
		t.Fatalf("no bind in the head's log\n%s", head.logs)
	}
	if m, _ := mustOK(t, hc, transport.OpInfo, "", nil); m["combined_bound_weights"] != float64(12) || m["combined_reason"] != "" {
		t.Fatalf("the head's INFO when bound: %v", m)
	}
	_, metrics, _ := httpDo(t, "GET", headHTTP+"/metrics", "")
	for _, want := range []string{"hydra_engine_combined_bound_weights 12\n", "hydra_engine_combined_peer_connected 1\n", "hydra_engine_combined_peer_lends 1\n"} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("the head's /metrics lacks %q", want)
		}
	}

	// The peer swaps its experts to q8: the head binds them again.
	gen := first["peer_generation"]
	mustOK(t, pc, transport.OpSwapQuant, "0", swapQuantPayload("q8", expertPattern))
	waitInfo(t, hc, "a new generation bound", func(m map[string]any) bool {
		return m["peer_generation"] != gen && m["mode"] == "combined" && strings.Count(head.logs.String(), "combined mode: bound to the peer engine's weights") == 2
	})
	if maps := pluginMaps(t, head); !strings.Contains(maps, q8) {
		t.Fatalf("the head's plugin does not map the peer's q8 file %s", q8)
	}
	peerTokens := greedy(t, pc, prompt, n)
	if got := greedy(t, hc, prompt, n); !slices.Equal(got, peerTokens) {
		t.Fatalf("bound to the peer's q8 experts: %v, the peer's own %v", got, peerTokens)
	}

	// The peer restarts with a model whose experts are another shape: the
	// head goes solo and says why.
	if err := peer.e.Stop(); err != nil {
		t.Fatal(err)
	}
	waitInfo(t, hc, "solo without the peer", func(m map[string]any) bool { return m["mode"] == "solo" && m["peer_connected"] == false })
	other := gguf.TinyMoE()
	other.ExpertFF = 48
	otherFile := filepath.Join(t.TempDir(), "other-moe.gguf")
	if err := gguf.WriteFile(otherFile, other); err != nil {
		t.Fatal(err)
	}
	peer = startPeer(otherFile)
	m = waitInfo(t, hc, "the other model refused", func(m map[string]any) bool {
		r, _ := m["combined_reason"].(string)
		return strings.Contains(r, "shape")
	})
	if m["mode"] != "solo" {
		t.Fatalf("bound to a model of another shape: %v", m)
	}
	if got := greedy(t, hc, prompt, n); !slices.Equal(got, solo) {
		t.Fatalf("solo after the refusal %v, want %v", got, solo)
	}

	// The peer back with its model: bound again without being asked.
	if err := peer.e.Stop(); err != nil {
		t.Fatal(err)
	}
	peer = startPeer(peerFile)
	waitInfo(t, hc, "bound after the restart", func(m map[string]any) bool { return m["mode"] == "combined" })
	if got := greedy(t, hc, prompt, n); !slices.Equal(got, solo) {
		t.Fatalf("combined after the restart %v, solo %v", got, solo)
	}

	// Solo: the head's own weights again.
	if m, _ := mustOK(t, hc, transport.OpSetExpertMode, "0", []byte("solo")); m["mode"] != "solo" {
		t.Fatalf("SET_EXPERT_MODE solo: %v", m)
	}
	if got := greedy(t, hc, prompt, n); !slices.Equal(got, solo) {
		t.Fatalf("solo again %v, want %v", got, solo)
	}

	// Binding while the slot decodes: the switch waits for no slot, made
	// between two steps; the sequence decodes on, token for token as solo.
	const long = 400
	soloLong := greedy(t, hc, prompt, long)
	mustOK(t, hc, transport.OpPrefill, "0", chat(prompt))
	type result struct {
		ids []uint32
		err error
	}
	done := make(chan result, 1)
	dc := client(t, head.tcp)
	go func() {
		resp, payload, err := dc.Call(ctxT(t), transport.OpDecode, "0", decodeJSON(long))
		if err == nil && resp.Status != transport.StatusOK {
			err = fmt.Errorf("DECODE: %v %s", resp.Status, resp.Meta)
		}
		var ids []uint32
		if err == nil {
			frames, ferr := transport.ParseDecodeFrames(payload)
			for _, f := range frames {
				ids = append(ids, f.TokenID)
			}
			err = ferr
		}
		done <- result{ids, err}
	}()
	waitInfo(t, hc, "the slot decoding", func(map[string]any) bool {
		m, _ := mustOK(t, hc, transport.OpStateMeta, "0", nil)
		return m["is_processing"] == true
	})
	if m, _ := mustOK(t, hc, transport.OpSetExpertMode, "0", []byte("combined")); m["mode"] != "combined" {
		t.Fatalf("SET_EXPERT_MODE combined while decoding: %v", m)
	}
	overlapped := len(done) == 0
	r := <-done
	if r.err != nil || !slices.Equal(r.ids, soloLong) {
		t.Fatalf("decoding across the switch: %v %v, solo %v", r.ids, r.err, soloLong)
	}
	if !overlapped {
		t.Fatal("the decode ended before the switch was answered: the switch waited for it")
	}

	// The head's plugin dies: the plugin the supervisor starts again is
	// bound again, unasked.
	kids, err := enginetest.Children(head.e.Pid())
	if err != nil || len(kids) != 1 {
		t.Fatalf("the head's plugin: %v %v", kids, err)
	}
	if err := syscall.Kill(kids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitInfo(t, hc, "a new plugin bound again", func(m map[string]any) bool {
		now, _ := enginetest.Children(head.e.Pid())
		return len(now) == 1 && now[0] != kids[0] && m["mode"] == "combined" && m["combined_bound_weights"] == float64(12)
	})
	if got := greedy(t, hc, prompt, n); !slices.Equal(got, solo) {
		t.Fatalf("bound again after the plugin's restart %v, solo %v", got, solo)
	}
	_ = peer
}
