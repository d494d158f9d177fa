//go:build linux

package shm

import (
	"context"
	"fmt"
	"io"
	"os"
)

// The host's relay for restores on the ring from a TCP socket: a goroutine
// splices the socket into two pipes of the host's own, as feed does for a
// plugin's pipes, and the ring's fill reads them out, so the one copy of each
// byte, into the ring, runs on another thread than the socket's receive
// work. On Unix sockets it lost to the host reading the socket itself
// (docs/design/data-plane.md), so they are not relayed.

// relayPipes is how many pipes a relay fills in turn (feed tells a reader
// of segments only with more than one).
const relayPipes = 2

// relay is an io.Reader of a restore's bytes that a feeder goroutine
// splices from the socket.
type relay struct {
	ps     pipeSet
	r      []*os.File // the pipes' read ends, in the poller
	segs   chan relaySeg
	done   chan struct{} // closed once the feeder returned
	rerr   error         // why the feeder stopped early; set before done
	fed    int64         // bytes the feeder took from the socket; set before done
	cancel context.CancelFunc
	k      int   // the pipe being read
	told   int64 // bytes it holds for the reader, not read yet
}

type relaySeg struct {
	k int
	n int64
}

// startRelay starts feeding size bytes of src into a relay.
func startRelay(ctx context.Context, src SocketSource, size int64) (*relay, error) {
	rs, ps, err := newPipeSet(relayPipes)
	if err != nil {
		return nil, err
	}
	r := &relay{ps: ps, segs: make(chan relaySeg, 2*relayPipes), done: make(chan struct{})}
	for _, fd := range rs { // non-blocking, as newPipe made them
		r.r = append(r.r, os.NewFile(uintptr(fd), "hydra-relay-pipe"))
	}
	// The feeder's waits for room are waits on the ring's fill, not on the
	// plugin: the fill's own waits for free buffers are the plugin's, and
	// the trace has one writer.
	ctx, r.cancel = context.WithCancel(WithTransferTrace(ctx, nil))
	unblock := context.AfterFunc(ctx, r.ps.unblock)
	go func() {
		defer close(r.done)
		defer unblock()
		fed, rerr, gone := r.ps.feed(ctx, src, size, func(k int, n int64) error {
			select {
			case r.segs <- relaySeg{k, n}:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		if rerr == nil && gone {
			rerr = fmt.Errorf("host relay stopped: %w", context.Canceled)
		}
		r.rerr, r.fed = rerr, fed
		close(r.segs)
	}()
	return r, nil
}

// Read reads the bytes in the order the feeder told of them, and after them
// the feeder's error, if it stopped early.
func (r *relay) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if r.told == 0 {
		seg, ok := <-r.segs
		if !ok {
			<-r.done
			if r.rerr != nil {
				return 0, r.rerr
			}
			return 0, io.EOF
		}
		r.k, r.told = seg.k, seg.n
	}
	n, err := r.r[r.k].Read(p[:min(int64(len(p)), r.told)])
	r.told -= int64(n)
	if n == 0 && err != nil {
		return 0, fmt.Errorf("host relay: reading its pipe: %w", err)
	}
	return n, nil
}

// stop ends the feeding, if it has not ended, and waits for the feeder: a
// feeder waiting for room or to be read gives up at once, one waiting for
// the client's bytes when it next gets them (a pipe without a reader) or at
// the connection's read deadline. The caller then owns the socket again.
func (r *relay) stop() {
	r.cancel()
	for _, f := range r.r {
		f.Close()
	}
	<-r.done
	r.ps.closePipes()
}
