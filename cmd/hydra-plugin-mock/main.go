// Command hydra-plugin-mock serves the mock backend as a hydra-engine plugin
// process. Logs go to stderr as JSON, where go-plugin forwards them to the host.
package main

import (
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	"github.com/hydra-engine/hydra-engine/plugins/mock"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

func main() {
	logger := hclog.New(&hclog.LoggerOptions{
		Name:       "mock",
		JSONFormat: true,
		Output:     os.Stderr,
		Level:      hclog.Trace,
	})
	iface.Serve(mock.New(logger), iface.ServeOptions{Logger: logger, Extend: shm.Extend})
}
