package main

import (
	"context"
	"fmt"
	"net"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/host"
	"github.com/hydra-engine/hydra-engine/host/combined"
	"github.com/hydra-engine/hydra-engine/transport"
)

// checkCombinedAddrs checks --lend-weights and --combined-peer: HOST:PORT
// each, the lending one on a loopback address, since what is lent (files,
// device memory) is of this host only and names its paths.
func checkCombinedAddrs(lend, peer string) error {
	if lend != "" {
		if err := peerAddress(lend); err != nil {
			return fmt.Errorf("lend_weights %q: %w", lend, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
		loopback, err := transport.HostLoopbackOnly(ctx, lend)
		cancel()
		if err != nil {
			return fmt.Errorf("lend_weights %q: %w", lend, err)
		}
		if !loopback {
			return fmt.Errorf("lend_weights %q: want a loopback address (127.0.0.1:PORT, [::1]:PORT or localhost:PORT): the weights are lent to engines of this host only", lend)
		}
	}
	if peer != "" {
		if err := peerAddress(peer); err != nil {
			return fmt.Errorf("combined_peer %q: %w", peer, err)
		}
		if lend != "" && lend == peer {
			return fmt.Errorf("combined_peer %q is this engine's own lend_weights", peer)
		}
	}
	return nil
}

// listenLend opens the lending port before the model loads, so that a
// taken port fails the start; nil without --lend-weights.
func listenLend(c *Config) (net.Listener, error) {
	if c.LendWeights == "" {
		return nil, nil
	}
	l, err := net.Listen("tcp", c.LendWeights)
	if err != nil {
		return nil, fmt.Errorf("lend_weights: %w", err)
	}
	return l, nil
}

// startPeering lends on lend and follows the combined peer, as configured.
func startPeering(c *Config, logger hclog.Logger, srv *host.Server, lend net.Listener) {
	if lend != nil {
		logger.Info("lending this engine's weights to combined heads of this host", "addr", lend.Addr().String())
		srv.LendOn(lend)
	}
	if c.CombinedPeer != "" {
		logger.Info("combined mode: following the peer engine", "peer", c.CombinedPeer)
		srv.FollowPeer(combined.NewLink(c.CombinedPeer, logger.Named("combined")))
	}
}
