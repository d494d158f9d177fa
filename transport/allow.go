package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"
)

// The Hydra protocol carries no credentials, so who may connect to a TCP
// listener is decided by the peer's address (an AllowList), by a client
// certificate (mutual TLS), or by the listener binding loopback only.

// AllowList is the peers allowed to connect: addresses and CIDR prefixes.
type AllowList []netip.Prefix

// ParseAllowList reads allow-list entries: an IP address (that one host,
// e.g. "10.1.2.3" or "fd00::7") or a CIDR prefix ("10.0.0.0/8",
// "fd00::/64"). An entry holding commas is split, as the environment gives
// lists.
func ParseAllowList(entries []string) (AllowList, error) {
	var list AllowList
	for _, entry := range entries {
		for e := range strings.SplitSeq(entry, ",") {
			if e = strings.TrimSpace(e); e == "" {
				continue
			}
			p, err := parseAllowEntry(e)
			if err != nil {
				return nil, err
			}
			list = append(list, p)
		}
	}
	return list, nil
}

// parseAllowEntry reads one entry as a prefix, an address being the prefix
// of its full length. IPv4-mapped IPv6 forms are taken as the IPv4 they map.
func parseAllowEntry(e string) (netip.Prefix, error) {
	if !strings.Contains(e, "/") {
		a, err := netip.ParseAddr(e)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, fmt.Errorf("allow-list entry %q is not an IP address or CIDR prefix (e.g. 10.0.0.5, 10.0.0.0/8, fd00::/64)", e)
		}
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	p, err := netip.ParsePrefix(e)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("allow-list entry %q is not an IP address or CIDR prefix (e.g. 10.0.0.5, 10.0.0.0/8, fd00::/64): %v", e, err)
	}
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, fmt.Errorf("allow-list entry %q: an IPv4-mapped prefix needs at least 96 bits", e)
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}

// Allows reports whether peer may connect. A dual-stack listener sees IPv4
// peers as IPv4-mapped IPv6 addresses, and a link-local peer carries a zone;
// both are compared as the plain address.
func (l AllowList) Allows(peer netip.Addr) bool {
	peer = peer.Unmap().WithZone("")
	for _, p := range l {
		if p.Contains(peer) {
			return true
		}
	}
	return false
}

// String lists the entries, comma-separated.
func (l AllowList) String() string {
	s := make([]string, len(l))
	for i, p := range l {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

// RefusedLogInterval is the least time between two reports of refused
// peers: a scan or a flood of connections must not flood the log.
const RefusedLogInterval = 10 * time.Second

// AllowPeers wraps l so that Accept returns only connections from peers the
// list allows: any other is closed at once, before a byte is read or a TLS
// handshake starts, and Accept waits for the next. refused, when not nil,
// reports the refusals at most once per RefusedLogInterval: the last peer
// refused and how many were refused since the previous report.
func AllowPeers(l net.Listener, allow AllowList, refused func(peer string, n int)) net.Listener {
	return &allowListener{Listener: l, allow: allow, refused: refused}
}

type allowListener struct {
	net.Listener
	allow   AllowList
	refused func(peer string, n int)

	mu       sync.Mutex
	reported time.Time // when refused was last called
	pending  int       // refusals not reported yet
}

func (l *allowListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		peer, err := peerAddr(c.RemoteAddr())
		if err == nil && l.allow.Allows(peer) {
			return c, nil
		}
		c.Close()
		l.report(c.RemoteAddr().String())
	}
}

// report counts one refusal and passes the count on when the interval
// since the last report has passed.
func (l *allowListener) report(peer string) {
	if l.refused == nil {
		return
	}
	l.mu.Lock()
	l.pending++
	now := time.Now()
	if !l.reported.IsZero() && now.Sub(l.reported) < RefusedLogInterval {
		l.mu.Unlock()
		return
	}
	n := l.pending
	l.reported, l.pending = now, 0
	l.mu.Unlock()
	l.refused(peer, n)
}

// peerAddr is the IP address of a connection's remote end.
func peerAddr(a net.Addr) (netip.Addr, error) {
	if ta, ok := a.(*net.TCPAddr); ok {
		return ta.AddrPort().Addr(), nil
	}
	ap, err := netip.ParseAddrPort(a.String())
	if err != nil {
		return netip.Addr{}, fmt.Errorf("peer address %q: %w", a, err)
	}
	return ap.Addr(), nil
}

// lookupNetIP resolves a listener's host name; tests replace it.
var lookupNetIP = net.DefaultResolver.LookupNetIP

// LoopbackOnly reports whether a listener at rawURL (see ParseURL) can be
// reached from this host alone: a unix:// socket, or a tcp:// or tls://
// address whose host is a loopback address or a name resolving only to
// loopback addresses. An empty host, 0.0.0.0 or :: binds every interface.
func LoopbackOnly(ctx context.Context, rawURL string) (bool, error) {
	network, address, err := ParseURL(rawURL)
	if err != nil {
		return false, err
	}
	if network == "unix" {
		return true, nil
	}
	return HostLoopbackOnly(ctx, address)
}

// HostLoopbackOnly is LoopbackOnly for a TCP host:port.
func HostLoopbackOnly(ctx context.Context, hostport string) (bool, error) {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		return false, err
	}
	if host == "" {
		return false, nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		return a.Unmap().IsLoopback(), nil
	}
	addrs, err := lookupNetIP(ctx, "ip", host)
	if err != nil {
		return false, fmt.Errorf("resolving %q: %w", host, err)
	}
	if len(addrs) == 0 {
		return false, errors.New("resolving " + host + ": no addresses")
	}
	for _, a := range addrs {
		if !a.Unmap().IsLoopback() {
			return false, nil
		}
	}
	return true, nil
}
