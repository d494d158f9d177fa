//go:build !unix

package host

import "github.com/hydra-engine/hydra-engine/transport"

// Without Unix sockets and shared-memory files there is no STATE_EXPORT or
// STATE_IMPORT (ops_handoff.go).

const handoffCapability = ""

type exportFile struct{}

func (e *exportFile) remove() {}

func (s *Server) handleStateExport(req *request, rp *replier) error {
	return rp.fail(transport.StatusNotImplemented, "STATE_EXPORT needs a Unix system's shared memory")
}

func (s *Server) handleStateImport(req *request, rp *replier) error {
	return rp.fail(transport.StatusNotImplemented, "STATE_IMPORT needs a Unix system's shared memory")
}
