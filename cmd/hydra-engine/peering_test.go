package main

import (
	"strings"
	"testing"
)

// TestCombinedAddrs: lending listens on loopback addresses only, a head's
// peer is HOST:PORT and not its own lending port.
func TestCombinedAddrs(t *testing.T) {
	for _, tc := range []struct{ lend, peer, want string }{
		{"127.0.0.1:9506", "", ""},
		{"[::1]:9506", "localhost:9505", ""},
		{"localhost:9506", "10.0.0.2:9505", ""},
		{"0.0.0.0:9506", "", "want a loopback address"},
		{"192.168.1.4:9506", "", "want a loopback address"},
		{"127.0.0.1", "", "want HOST:PORT"},
		{"", "localhost", "combined_peer \"localhost\": want HOST:PORT"},
		{"127.0.0.1:9506", "127.0.0.1:9506", "is this engine's own lend_weights"},
	} {
		err := checkCombinedAddrs(tc.lend, tc.peer)
		if (tc.want == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("lend %q peer %q: %v, want %q", tc.lend, tc.peer, err, tc.want)
		}
	}
}
