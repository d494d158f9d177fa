//go:build !linux

package shm

import (
	"context"
	"errors"
	"os"

	"github.com/hydra-engine/hydra-engine/iface"
	backendv1 "github.com/hydra-engine/hydra-engine/iface/proto/hydra/backend/v1"
)

// The shared-memory data plane needs memfd and SCM_RIGHTS (Linux); elsewhere
// state bytes travel as gRPC streams: NewHost fails, Extend serves the
// adapter as it is.

const EnvFD = "HYDRA_SHM_FD"

var errNoShm = errors.New("shm data plane: Linux only")

// ErrNotServed: see the Linux build.
var ErrNotServed = errors.New("shm data plane: not served by the plugin")

type Host struct{}

func NewHost() (*Host, *os.File, error) { return nil, nil, errNoShm }

func (h *Host) Close() error { return nil }

type Client struct{ *iface.GRPCClient }

func Connect(context.Context, *iface.GRPCClient, *Host) (*Client, error) { return nil, ErrNotServed }

func (c *Client) Splices() string { return "false" }

func Extend(s *iface.GRPCServer) backendv1.BackendServer { return s }
