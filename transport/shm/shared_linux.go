package shm

import (
	"context"
	"errors"
	"fmt"
	"time"

	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// A transfer on a SharedRing has two parties to wait on, the plugin (its
// control socket) and the ring's owner (which wakes its waiters itself), so
// it runs two loops: one reads the plugin's messages, the other waits on the
// owner and writes to the plugin. They share the control socket only as a
// socket (each datagram written whole), never its batching.

var _ SharedGetter = (*Client)(nil)

// StateGetShared streams the slot's state into ring's buffers: the plugin
// fills each in place, sink takes it, and a buffer is filled again only once
// sink's consumer has given it back.
func (c *Client) StateGetShared(ctx context.Context, slot int, ring SharedRing, sink SharedSink) (int64, error) {
	t, err := c.host.beginShared(ring)
	if err != nil {
		return 0, err
	}
	traceOf(ctx).path(PathShared)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resc := make(chan shmResult, 1)
	go func() {
		resp, err := c.rpc.StateGetShm(ctx, &backendv1.StateGetShmRequest{Slot: int64(slot), Transfer: shmTransfer(t)})
		t.failed(err)
		resc <- shmResult{resp.GetWritten(), err}
	}()
	frees, stopFrees := context.WithCancel(ctx)
	ferr := make(chan error, 1)
	go func() { ferr <- t.passFrees(frees, sink) }()
	g := t.passFilled(sink)
	stopFrees()
	if err := <-ferr; g.werr == nil && err != nil && !errors.Is(err, context.Canceled) {
		g.werr = err // the consumer gave up: the plugin was told (ABORT)
	}
	if g.werr != nil {
		_ = t.write(msgAbort, 0, 0)
		cancel()
	}
	res := <-resc
	t.finish(false)
	return g.written, g.result(res)
}

// passFilled passes each buffer the plugin fills to sink, in turn, until
// END, ABORT or a failure.
func (t *hostTransfer) passFilled(sink SharedSink) (g getLoop) {
	for published := 0; ; published++ {
		k, n, ok := t.nextFilled(waitClock{}, &g)
		switch {
		case !ok:
			return g
		case int(k) != published%t.ring.depth || n == 0 || n > uint64(t.ring.chunk):
			g.werr = fmt.Errorf("shm data plane: buffer (%d, %d) from the plugin, want buffer %d of at most %d bytes", k, n, published%t.ring.depth, t.ring.chunk)
			return g
		}
		if g.werr = sink.Filled(int(k), int(n)); g.werr != nil {
			return g
		}
		g.written += int64(n)
	}
}

// passFrees tells the plugin of each buffer sink's consumer gives back, in
// one datagram for those given back together, until ctx ends or the
// consumer fails; on a failure the plugin is told to stop (ABORT).
func (t *hostTransfer) passFrees(ctx context.Context, sink SharedSink) error {
	var msgs []byte
	for freed := 0; ; {
		f, err := sink.AwaitFreed(ctx, freed)
		if err != nil {
			if ctx.Err() == nil {
				_ = t.write(msgAbort, 0, 0)
			}
			return err
		}
		for msgs = msgs[:0]; freed < f && len(msgs) < (ctrlMaxBatch-1)*ctrlMsgSize; freed++ {
			msgs = appendMsg(msgs, msgFree, uint32(freed%t.ring.depth), 0)
		}
		if _, err := t.ctrl.c.Write(msgs); err != nil {
			return nil // the plugin is gone; its result says why
		}
	}
}

// write sends one message at once, apart from the control socket's batching
// (which belongs to the loop reading it).
func (t *hostTransfer) write(kind, k uint32, n uint64) error {
	_, err := t.ctrl.c.Write(appendMsg(nil, kind, k, n))
	return err
}

// statePutShared restores size bytes from src's ring: each buffer its
// producer fills is summed (sum, if any) and passed to the plugin, which
// reads it in place, and given back to the producer once the plugin is done
// with it. The producer never has more than the ring's buffers out, so
// neither does the plugin.
func (c *Client) statePutShared(ctx context.Context, slot int, tokens []int32, src SharedSource, sum *SumReader, size int64) (int64, error) {
	t, err := c.host.beginShared(src.Shared())
	if err != nil {
		return 0, err
	}
	traceOf(ctx).path(PathShared)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resc := make(chan shmResult, 1)
	go func() {
		resp, err := c.rpc.StatePutShm(ctx, &backendv1.StatePutShmRequest{
			Slot: int64(slot), Tokens: tokens, Size: size, Transfer: shmTransfer(t),
		})
		t.failed(err)
		resc <- shmResult{resp.GetConsumed(), err}
	}()
	// The plugin's frees go back to the producer until it stops reading:
	// after the END it frees the last buffers and closes its end.
	feeding, stopFeeding := context.WithCancel(ctx)
	defer stopFeeding()
	freesDone := make(chan struct{})
	go func() {
		defer close(freesDone)
		defer stopFeeding() // the plugin stopped reading: so does the feed
		for {
			if kind, _, _, err := t.ctrl.recv(); err != nil || kind != msgFree {
				return
			}
			src.Free()
		}
	}()
	sent, rerr := t.feedShared(feeding, src, sum, size)
	pluginDone := false
	if rerr != nil && (errors.Is(rerr, errPluginGone) || (feeding.Err() != nil && ctx.Err() == nil)) {
		pluginDone, rerr = true, nil // its result says why
	}
	switch {
	case rerr != nil:
		_ = t.write(msgAbort, 0, 0)
	case !pluginDone:
		_ = t.write(msgEnd, 0, uint64(sent))
	}
	res := <-resc
	t.ctrl.c.SetReadDeadline(time.Unix(1, 0)) // the frees' loop ends with the call
	<-freesDone
	t.finish(false)
	return putResult(res, rerr, pluginDone)
}

// feedShared posts src's buffers to the plugin as they are filled, until
// size bytes went; an error is the producer failing, a bad buffer, or ctx
// ending (the plugin stopped reading).
func (t *hostTransfer) feedShared(ctx context.Context, src SharedSource, sum *SumReader, size int64) (int64, error) {
	var sent int64
	for seq := 0; sent < size; seq++ {
		k, n, err := src.Next(ctx)
		switch {
		case err != nil:
			return sent, err
		case k != seq%t.ring.depth || n <= 0 || n > t.ring.chunk || sent+int64(n) > size:
			return sent, fmt.Errorf("the shared ring's buffer (%d, %d) after %d of %d bytes: want buffer %d of at most %d bytes", k, n, sent, size, seq%t.ring.depth, t.ring.chunk)
		}
		if sum != nil {
			sum.Add(t.ring.buf(k)[:n])
		}
		if err := t.write(msgFilled, uint32(k), uint64(n)); err != nil {
			return sent, errPluginGone
		}
		sent += int64(n)
	}
	return sent, nil
}

// errPluginGone is a write to a plugin that closed its end of the transfer.
var errPluginGone = errors.New("shm data plane: the plugin left the transfer")
