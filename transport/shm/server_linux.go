//go:build linux

package shm

import (
	"context"
	"fmt"
	"io"

	"google.golang.org/grpc"

	"github.com/hydra-engine/hydra-engine/iface"
	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// Extend makes the plugin's gRPC adapter answer the shared-memory plane's
// calls over the socket the host passed as fd EnvFD; a plugin started without
// one serves state bytes as gRPC streams only. Plugins pass it as
// iface.ServeOptions.Extend.
func Extend(s *iface.GRPCServer) backendv1.BackendServer {
	r := receiverFromEnv()
	if r == nil {
		return s
	}
	return &server{GRPCServer: s, recv: r}
}

// server is the adapter with the plane's three calls answered.
type server struct {
	*iface.GRPCServer
	recv *receiver
}

// DataPlane tells the host that this plugin serves the plane, which control
// format it speaks and for which restores it takes pipes (PipePutter).
func (s *server) DataPlane(context.Context, *backendv1.DataPlaneRequest) (*backendv1.DataPlaneResponse, error) {
	pipe, pipeMax := true, 0
	if p, ok := s.Impl.(PipePutter); ok {
		pipeMax = p.PipePutMaxChunk()
		pipe = pipeMax != 0
		pipeMax = max(pipeMax, 0)
	}
	return &backendv1.DataPlaneResponse{Shm: true, CtrlVersion: ctrlVersion, PipePut: pipe, PipePutMaxChunk: int64(pipeMax), PipePutMaxPipes: maxPipes, PipePutSum: true}, nil
}

// StateGetShm produces the slot's state into the ring the host passed.
func (s *server) StateGetShm(ctx context.Context, req *backendv1.StateGetShmRequest) (*backendv1.StateGetShmResponse, error) {
	tr := req.GetTransfer()
	if tr.GetPipe() {
		return nil, iface.ToStatus(fmt.Errorf("%w: a state pipe carries restores only", iface.ErrBadRequest))
	}
	t, err := s.recv.open(ctx, tr)
	if err != nil {
		return nil, iface.ToStatus(err)
	}
	defer t.close()
	leave, err := s.EnterSlot(ctx, int(req.GetSlot()))
	if err != nil {
		_ = t.ctrl.send(msgAbort, 0, 0)
		return nil, iface.ToStatus(err)
	}
	defer leave()
	w := &shmWriter{t: t}
	_, err = s.Impl.StateGet(ctx, int(req.GetSlot()), int(tr.GetChunkSize()), w)
	if err == nil {
		err = w.flush()
	}
	// Wait until the host has sent every buffer: then no message is left
	// unread when the sockets close (an unread message would turn the
	// close into a reset that swallows the end mark), and the end mark means
	// the bytes are out.
	for err == nil && w.inflight > 0 {
		err = w.awaitFree()
	}
	if err == nil {
		err = t.ctrl.send(msgEnd, 0, uint64(w.total))
	}
	if err != nil {
		_ = t.ctrl.send(msgAbort, 0, 0)
		return nil, iface.ToStatus(err)
	}
	return &backendv1.StateGetShmResponse{Written: w.total}, nil
}

// StatePutShm restores the slot from the ring or pipes the host passed.
func (s *server) StatePutShm(ctx context.Context, req *backendv1.StatePutShmRequest) (*backendv1.StatePutResponse, error) {
	if req.GetSize() < 0 {
		return nil, iface.ToStatus(fmt.Errorf("%w: negative state size", iface.ErrBadRequest))
	}
	t, err := s.recv.open(ctx, req.GetTransfer())
	if err != nil {
		return nil, iface.ToStatus(err)
	}
	defer t.close()
	leave, err := s.EnterSlot(ctx, int(req.GetSlot()))
	if err != nil {
		_ = t.ctrl.send(msgAbort, 0, 0)
		return nil, iface.ToStatus(err)
	}
	defer leave()
	var r interface {
		io.Reader
		drain() error
	} = &shmReader{t: t, remain: req.GetSize()}
	if t.pipes != nil {
		pr := &pipeReader{t: t, remain: req.GetSize(), sum: req.GetSum(), crc: req.GetSumSeed()}
		if pr.sum {
			// The host checks the sum whatever the restore came to (it names
			// bytes that changed on the way rather than what they made the
			// backend say), so it rides on the trailer, not the response.
			defer func() { _ = grpc.SetTrailer(ctx, pipeSumMeta(pr.crc, pr.total)) }()
		}
		r = pr
	}
	n, err := s.Impl.StatePut(ctx, int(req.GetSlot()), req.GetTokens(), r, req.GetSize())
	if err == nil {
		// Success means every byte arrived, as on the gRPC plane.
		err = r.drain()
	}
	if err != nil {
		_ = t.ctrl.send(msgAbort, 0, 0)
		return nil, iface.ToStatus(err)
	}
	return &backendv1.StatePutResponse{Consumed: n}, nil
}
