package host

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/host/combined"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// peerBackend lends what the test sets; headBackend binds a registry whose
// arch is "ok" and records what it was asked.
type peerBackend struct {
	quantBackend
	mu  sync.Mutex
	reg iface.WeightRegistry
	err error
}

func (b *peerBackend) set(reg iface.WeightRegistry, err error) {
	b.mu.Lock()
	b.reg, b.err = reg, err
	b.mu.Unlock()
}

func (b *peerBackend) LendWeights(context.Context) (iface.WeightRegistry, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.reg, b.err
}

type headBackend struct {
	quantBackend
	mu    sync.Mutex
	binds []string // generations bound
	solos int
	mode  string
}

func (b *headBackend) BindPeer(_ context.Context, reg iface.WeightRegistry) (iface.ExpertModeResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if reg.Arch != "ok" {
		b.mode = "solo"
		return iface.ExpertModeResult{Mode: "solo", Reason: "blk.0.ffn_up_exps.weight: shape [8 4] on the peer, [8 2] here"}, nil
	}
	b.binds = append(b.binds, reg.Generation)
	b.mode = "combined"
	return iface.ExpertModeResult{Mode: "combined", Bound: len(reg.Weights)}, nil
}

func (b *headBackend) SetExpertMode(_ context.Context, mode string) (string, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if mode == "solo" {
		b.solos++
	}
	b.mode = "solo"
	return "solo", nil
}

func (b *headBackend) Info(context.Context) (iface.BackendInfo, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	info := b.info
	info.ExpertMode = b.mode
	return info, nil
}

func (b *headBackend) bound() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.binds...)
}

func lentRegistry(gen, arch string) iface.WeightRegistry {
	return iface.WeightRegistry{Generation: gen, Arch: arch, Weights: []iface.LentWeight{
		{Name: "blk.0.ffn_up_exps.weight", Type: "q8_0", Shape: []int64{8, 4}, Bytes: 34, Device: "CPU", File: "/m.gguf", Offset: 64},
	}}
}

func infoMeta(t *testing.T, s *Server) map[string]any {
	t.Helper()
	st, meta := handle(t, s, s.handleInfo, nil)
	var m map[string]any
	if st != transport.StatusOK || json.Unmarshal(meta, &m) != nil {
		t.Fatalf("INFO %v %s", st, meta)
	}
	return m
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("waited in vain for " + what)
		}
	}
}

// TestCombinedBetweenEngines: a head binds to what its peer lends on
// SET_EXPERT_MODE combined, binds again when the peer's generation changes,
// goes back to solo while the peer lends nothing and binds once it lends
// again; a registry its backend refuses answers solo with the reason, and
// INFO tells all of it.
func TestCombinedBetweenEngines(t *testing.T) {
	pb := &peerBackend{quantBackend: quantBackend{info: iface.BackendInfo{Name: "p", NSlots: 1}}}
	pb.set(lentRegistry("g1", "ok"), nil)
	peer := NewServer(pb, pb.info, nil, Config{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peer.LendOn(ln)
	defer peer.Close()

	hb := &headBackend{quantBackend: quantBackend{info: iface.BackendInfo{Name: "h", NSlots: 1}}, mode: "solo"}
	head := NewServer(hb, hb.info, nil, Config{Logger: hclog.NewNullLogger()})
	head.FollowPeer(combined.NewLink(ln.Addr().String(), hclog.NewNullLogger()))
	defer head.Close()

	waitUntil(t, "the head to see the peer's weights", func() bool { return infoMeta(t, head)["peer_reachable"] == true })
	if m := infoMeta(t, peer); m["rpc_backend_active"] != true || m["lent_to_heads"] != float64(1) {
		t.Fatalf("the peer's INFO: %v", m)
	}
	st, meta := handle(t, head, head.handleSetExpertMode, []byte("combined"))
	if st != transport.StatusOK || string(meta) != `{"success":true,"mode":"combined","peer_connected":true}` {
		t.Fatalf("SET_EXPERT_MODE combined: %v %s", st, meta)
	}
	if st := head.Combined(); !st.Following || !st.Connected || !st.PeerLends || st.Bound != 1 || st.Lending {
		t.Fatalf("the head's status: %+v", st)
	}
	if st := peer.Combined(); !st.Lending || st.Heads != 1 || st.Following {
		t.Fatalf("the peer's status: %+v", st)
	}
	if m := infoMeta(t, head); m["mode"] != "combined" || m["peer_generation"] != "g1" || m["peer_addr"] != ln.Addr().String() ||
		m["combined_bound_weights"] != float64(1) ||
		!strings.Contains(strings.Join(toStrings(m["capabilities"]), ","), "combined") {
		t.Fatalf("the head's INFO: %v", m)
	}

	// A swap on the peer: a new generation, bound again.
	pb.set(lentRegistry("g2", "ok"), nil)
	peer.nudgeLender()
	waitUntil(t, "binding generation g2", func() bool { b := hb.bound(); return len(b) == 2 && b[1] == "g2" })

	// The peer's plugin down: solo, the reason in INFO.
	pb.set(iface.WeightRegistry{}, errors.New("the backend is restarting"))
	peer.nudgeLender()
	waitUntil(t, "solo while the peer lends nothing", func() bool { return infoMeta(t, head)["mode"] == "solo" })
	if m := infoMeta(t, head); !strings.Contains(m["combined_reason"].(string), "the backend is restarting") {
		t.Fatalf("the head's INFO: %v", m)
	}

	// Back: bound again without being asked.
	pb.set(lentRegistry("g3", "ok"), nil)
	peer.nudgeLender()
	waitUntil(t, "binding generation g3", func() bool { return infoMeta(t, head)["mode"] == "combined" })

	// A peer whose weights do not fit: solo, the backend's reason.
	pb.set(lentRegistry("g4", "bad"), nil)
	peer.nudgeLender()
	waitUntil(t, "solo on a mismatch", func() bool { return infoMeta(t, head)["mode"] == "solo" })
	st, meta = handle(t, head, head.handleSetExpertMode, []byte("combined"))
	if st != transport.StatusOK || !strings.Contains(string(meta), `"mode":"solo","peer_connected":false,"reason":"blk.0.ffn_up_exps.weight: shape`) {
		t.Fatalf("SET_EXPERT_MODE combined on a mismatch: %v %s", st, meta)
	}

	// Solo asked for: a later generation binds nothing.
	handle(t, head, head.handleSetExpertMode, []byte("solo"))
	n := len(hb.bound())
	pb.set(lentRegistry("g5", "ok"), nil)
	peer.nudgeLender()
	time.Sleep(200 * time.Millisecond)
	if len(hb.bound()) != n {
		t.Fatal("bound after solo was asked for")
	}
}

// TestCombinedPeerDown: a head whose peer is not there answers solo with
// the reason, and peer_connected false, which the coordinator reads as a
// refusal.
func TestCombinedPeerDown(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	hb := &headBackend{quantBackend: quantBackend{info: iface.BackendInfo{Name: "h", NSlots: 1}}, mode: "solo"}
	head := NewServer(hb, hb.info, nil, Config{})
	head.FollowPeer(combined.NewLink(addr, hclog.NewNullLogger()))
	defer head.Close()
	waitUntil(t, "a refused connection", func() bool {
		r, _ := infoMeta(t, head)["combined_reason"].(string)
		return strings.Contains(r, "refused")
	})
	st, meta := handle(t, head, head.handleSetExpertMode, []byte("combined"))
	if st != transport.StatusOK || !strings.HasPrefix(string(meta), `{"success":true,"mode":"solo","peer_connected":false,"reason":"the peer `+addr) {
		t.Fatalf("SET_EXPERT_MODE combined: %v %s", st, meta)
	}
	if len(hb.bound()) != 0 {
		t.Fatal("bound without a peer")
	}
}

func toStrings(v any) []string {
	var out []string
	for _, x := range v.([]any) {
		out = append(out, x.(string))
	}
	return out
}
