package host

import (
	"cmp"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"

	"github.com/hydra-engine/hydra-engine/host/combined"
	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/transport"
)

// Combined mode between two engines of one host (host/combined): a peer
// lends what its backend holds on its lending port; a head follows its
// peer and, on SET_EXPERT_MODE "combined", has its backend bind to the
// peer's weights, re-binding when the peer's generation changes and going
// back to solo when the peer lends nothing any more.

// peering is a server's side of it: the lender it serves, the peer it
// follows, and what is bound.
type peering struct {
	lender atomic.Pointer[combined.Lender]
	link   atomic.Pointer[combined.Link]

	mu     sync.Mutex // serialises binding: SET_EXPERT_MODE and the link's changes
	wanted bool       // the last SET_EXPERT_MODE asked for combined
	bound  string     // the peer's generation the backend is bound to; "" solo

	wmu     sync.Mutex // guards why and weights alone, so that INFO never waits for a bind
	why     string     // why combined is not active, when it was asked for and is not
	weights int        // weights bound to the peer's
}

func (p *peering) setWhy(why string) {
	p.wmu.Lock()
	p.why = why
	if why != "" {
		p.weights = 0
	}
	p.wmu.Unlock()
}

func (p *peering) setBound(weights int) {
	p.wmu.Lock()
	p.why, p.weights = "", weights
	p.wmu.Unlock()
}

// unbound records that the backend is bound to no generation, and why
// combined is not active. Callers hold mu.
func (p *peering) unbound(why string) {
	p.bound = ""
	p.setWhy(why)
}

func (p *peering) whyNow() (string, int) {
	p.wmu.Lock()
	defer p.wmu.Unlock()
	return p.why, p.weights
}

// LendOn serves what this engine's backend lends to heads connecting on
// ln, until Shutdown.
func (s *Server) LendOn(ln net.Listener) {
	lender := combined.NewLender(s.lendWeights, s.log.Named("lend"))
	if !s.peer.lender.CompareAndSwap(nil, lender) {
		lender = s.peer.lender.Load()
	}
	go func() {
		if err := lender.Serve(ln); err != nil {
			s.log.Error("combined: the lending port stopped", "addr", ln.Addr().String(), "error", err)
		}
	}()
}

// FollowPeer makes this engine a combined head of the peer k links to.
func (s *Server) FollowPeer(k *combined.Link) {
	s.peer.link.Store(k)
	k.Start(s.peerChanged)
}

// closePeering stops lending and following (Shutdown).
func (s *Server) closePeering() {
	lender, link := s.peer.lender.Load(), s.peer.link.Load()
	if lender != nil {
		lender.Close()
	}
	if link != nil {
		link.Close()
	}
}

func (s *Server) lendWeights(ctx context.Context) (iface.WeightRegistry, error) {
	b, _ := s.Backend()
	return b.LendWeights(ctx)
}

// nudgeLender tells the heads following this engine that what it lends
// may have changed (a swap).
func (s *Server) nudgeLender() {
	if lender := s.peer.lender.Load(); lender != nil {
		lender.Nudge()
	}
}

// setPeerMode answers SET_EXPERT_MODE on a head: "combined" binds the
// backend to what the peer lends now, "solo" unbinds it.
func (s *Server) setPeerMode(ctx context.Context, mode string) (active string, err error) {
	p := &s.peer
	p.mu.Lock()
	defer p.mu.Unlock()
	b, _ := s.Backend()
	if mode == "solo" {
		active, err = b.SetExpertMode(ctx, "solo")
		if err == nil {
			p.wanted, p.bound = false, ""
			p.setBound(0)
		}
		return active, err
	}
	p.wanted = true
	st := p.link.Load().State()
	if st.Registry == nil {
		p.setWhy(st.Why)
		s.log.Info("SET_EXPERT_MODE combined answered solo: " + st.Why)
		return s.soloNow(ctx, b), nil
	}
	return s.bindLocked(ctx, b, *st.Registry), nil
}

// bindLocked binds the backend to reg and says the mode it left active.
func (s *Server) bindLocked(ctx context.Context, b iface.Backend, reg iface.WeightRegistry) string {
	p := &s.peer
	res, err := b.BindPeer(ctx, reg)
	switch {
	case err != nil:
		why := "binding to the peer's weights: " + err.Error()
		if errors.Is(err, iface.ErrNotImplemented) {
			why = "this engine's backend cannot bind a peer's weights: " + err.Error()
		}
		p.unbound(why)
		s.log.Warn("combined mode stays off: " + why)
		return s.soloNow(ctx, b)
	case res.Mode != "combined":
		why := cmp.Or(res.Reason, "the backend stayed "+res.Mode)
		p.unbound(why)
		s.log.Warn("combined mode stays off: "+why, "peer", p.link.Load().Addr(), "generation", reg.Generation)
		return res.Mode
	}
	p.bound = reg.Generation
	p.setBound(res.Bound)
	s.log.Info("combined mode: bound to the peer's weights", "peer", p.link.Load().Addr(), "generation", reg.Generation, "weights", res.Bound)
	return "combined"
}

// soloNow is the mode the backend has after asking it for solo (a bound
// backend lets go of a peer that left).
func (s *Server) soloNow(ctx context.Context, b iface.Backend) string {
	active, err := b.SetExpertMode(ctx, "solo")
	if err != nil {
		s.log.Warn("combined: asking the backend for solo", "error", err)
		return "solo"
	}
	return active
}

// peerChanged follows the peer while combined is wanted: a new
// generation (a swap, a restart) binds again, a peer that lends nothing
// any more puts the backend back to solo until it lends again.
func (s *Server) peerChanged(st combined.State) {
	p := &s.peer
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.wanted {
		return
	}
	ctx := s.ctx
	b, _ := s.Backend()
	var mode string
	switch {
	case st.Registry == nil && p.bound != "":
		why := "the peer lends nothing now: " + st.Why
		p.unbound(why)
		s.log.Warn("combined mode off until the peer lends again: " + why)
		mode = s.soloNow(ctx, b)
	case st.Registry == nil:
		p.setWhy("the peer lends nothing now: " + st.Why)
		return
	case st.Registry.Generation != p.bound:
		s.log.Info("combined: the peer's weights changed; binding again", "from", p.bound, "to", st.Registry.Generation)
		mode = s.bindLocked(ctx, b, *st.Registry)
	default:
		return
	}
	s.tun.setExpertMode(mode)
	s.refreshInfo(b)
}

// rebindPeer binds a backend that replaced the bound one (a plugin
// restarted) to the peer's weights again.
func (s *Server) rebindPeer() {
	p := &s.peer
	p.mu.Lock()
	link := p.link.Load()
	if !p.wanted || link == nil {
		p.mu.Unlock()
		return
	}
	p.bound = ""
	p.mu.Unlock()
	go s.peerChanged(link.State())
}

// CombinedStatus is combined mode between engines now, as INFO and
// /metrics show it.
type CombinedStatus struct {
	Lending    bool   // this engine lends its weights
	Heads      int    // heads following it
	Following  bool   // this engine is a head of a peer engine
	Addr       string // the peer engine followed
	Connected  bool   // the link to the peer is up
	PeerLends  bool   // the peer lends weights now
	Generation string // of what the peer lends; "" while it lends nothing
	Why        string // why combined is not active, when it was asked for and is not
	Bound      int    // weights bound to the peer's
}

// Combined is combined mode between engines now.
func (s *Server) Combined() CombinedStatus {
	p := &s.peer
	var c CombinedStatus
	if lender := p.lender.Load(); lender != nil {
		c.Lending, c.Heads = true, lender.Heads()
	}
	if link := p.link.Load(); link != nil {
		st := link.State()
		c.Why, c.Bound = p.whyNow()
		c.Following, c.Addr, c.Connected, c.PeerLends = true, link.Addr(), st.Connected, st.Registry != nil
		if st.Registry != nil {
			c.Generation = st.Registry.Generation
		} else if c.Why == "" {
			c.Why = st.Why
		}
	}
	return c
}

// peer is INFO's peer_addr and peer_reachable: the peer engine followed,
// else the backend's peer device.
func (c CombinedStatus) peer(info iface.BackendInfo) (addr string, reachable bool) {
	if c.Following {
		return c.Addr, c.PeerLends
	}
	return info.PeerDevice, info.PeerReachable
}

// add adds INFO's fields beyond the reference engine's.
func (c CombinedStatus) add(m *transport.Meta) {
	if c.Lending {
		m.Add("lent_to_heads", c.Heads)
	}
	if c.Following {
		m.Add("peer_connected", c.Connected).Add("peer_generation", c.Generation).Add("combined_reason", c.Why).Add("combined_bound_weights", c.Bound)
	}
}

// peerHead reports whether this engine follows a peer.
func (s *Server) peerHead() bool { return s.peer.link.Load() != nil }
