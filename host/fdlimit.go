package host

import (
	"fmt"
	"os"

	"github.com/hashicorp/go-hclog"
)

// The engine's file descriptors besides its client connections: the plugin's
// gRPC connection and pipes, the data plane's sockets, rings and pipes of each
// transfer in flight (one per slot), log and model files. Connections are
// capped so that these always find a descriptor.
const (
	fdReserveBase    = 64
	fdReservePerSlot = 16
	// minFitConns is the fewest connections per listener the engine starts
	// with: below it the descriptor limit is a misconfiguration to fix, not
	// something to run with.
	minFitConns = 16
)

// FitConnLimit returns the connection limit per listener (want, the
// configured one) that fits the process's RLIMIT_NOFILE, for listeners
// listeners sharing the same limit (Hydra RPC and HTTP) and a backend of
// slots slots. Each listener may hold its limit plus the refusals in
// progress (maxRefusing); what the process has open already and a reserve
// for the plugin, the data plane and files come first. A limit that does
// not fit is lowered with one WARN line saying why; an error when not even
// minFitConns fit.
//
// The soft limit is not raised here: the Go runtime raises it to the hard
// limit for the process at start (Go 1.19 and later; its children get the
// original back), so the hard limit is what an operator sets (ulimit -Hn,
// systemd LimitNOFILE=).
func FitConnLimit(log hclog.Logger, want, listeners, slots int) (int, error) {
	soft, ok := nofileLimit()
	if !ok {
		return want, nil // nothing to fit against
	}
	open := openFDs()
	fit, err := fitConns(soft, open, want, listeners, slots)
	if err != nil {
		return 0, err
	}
	if fit < want {
		log.Warn("lowering the connection limit per listener to fit the file descriptor limit (raise RLIMIT_NOFILE, e.g. systemd LimitNOFILE=, to keep it)",
			"max_conns", want, "effective", fit, "nofile", soft, "open", open, "listeners", listeners,
			"reserved", fdReserve(slots), "per_listener_refusals", maxRefusing)
	}
	return fit, nil
}

// fitConns is FitConnLimit's arithmetic on a soft limit and the descriptors
// open now.
func fitConns(soft uint64, open, want, listeners, slots int) (int, error) {
	if want <= 0 {
		want = DefaultMaxConns
	}
	if listeners <= 0 {
		return want, nil
	}
	room := int64(min(soft, 1<<40)) - int64(open) - int64(fdReserve(slots))
	fit := room/int64(listeners) - maxRefusing
	if fit >= int64(want) {
		return want, nil
	}
	if fit < minFitConns {
		return 0, fmt.Errorf("the file descriptor limit (RLIMIT_NOFILE %d, %d open, %d kept for the plugin, the data plane and files) "+
			"leaves room for fewer than %d connections on each of %d listeners (each also answers up to %d refusals at once); "+
			"raise it (ulimit -n, systemd LimitNOFILE=)", soft, open, fdReserve(slots), minFitConns, listeners, maxRefusing)
	}
	return int(fit), nil
}

func fdReserve(slots int) int { return fdReserveBase + fdReservePerSlot*max(slots, 1) }

// openFDs counts the process's open descriptors (a guess where /proc is
// missing).
func openFDs() int {
	es, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return 32
	}
	return len(es) - 1 // the directory's own
}
