//go:build !linux

package iface

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// The shared-memory data plane needs memfd and SCM_RIGHTS (Linux); elsewhere
// state bytes travel as gRPC streams.

const ShmEnv = "HYDRA_SHM_FD"

var errNoShm = errors.New("shm data plane: Linux only")

type ShmHost struct{}

type ShmReceiver struct{}

func NewShmHost() (*ShmHost, *os.File, error) { return nil, nil, errNoShm }

func (h *ShmHost) Close() error { return nil }

func shmReceiverFromEnv() *ShmReceiver { return nil }

func (c *GRPCClient) UseShm(h *ShmHost, depth int) {}

func (c *GRPCClient) SplicesPuts() bool { return false }

func (c *GRPCClient) SplicePutMaxChunk() int64 { return 0 }

func (c *GRPCClient) DataPlane(ctx context.Context) (bool, error) { return false, nil }

func (c *GRPCClient) stateGetShm(ctx context.Context, slot, chunk int, w io.Writer) (int64, error) {
	return 0, errNoShm
}

func (c *GRPCClient) statePutShm(ctx context.Context, slot int, tokens []int32, r io.Reader, size int64) (int64, error) {
	return 0, errNoShm
}

func (s *GRPCServer) DataPlane(context.Context, *backendv1.DataPlaneRequest) (*backendv1.DataPlaneResponse, error) {
	return &backendv1.DataPlaneResponse{}, nil
}

func (s *GRPCServer) StateGetShm(context.Context, *backendv1.StateGetShmRequest) (*backendv1.StateGetShmResponse, error) {
	return nil, toStatus(fmt.Errorf("%w: %v", ErrNotImplemented, errNoShm))
}

func (s *GRPCServer) StatePutShm(context.Context, *backendv1.StatePutShmRequest) (*backendv1.StatePutResponse, error) {
	return nil, toStatus(fmt.Errorf("%w: %v", ErrNotImplemented, errNoShm))
}
