// Command hydra-plugin-cuda-llama serves the llama.cpp backend as a
// hydra-engine plugin process (--backend cuda-llama). Build it with
// `make build-llama`: without the build tag "llama" it is a stub whose Load
// fails saying so. Logs go to stderr as JSON, where go-plugin forwards them to
// the host.
package main

import (
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/hydra-engine/hydra-engine/iface"
	cudallama "github.com/hydra-engine/hydra-engine/plugins/cuda-llama"
	"github.com/hydra-engine/hydra-engine/transport/shm"
)

func main() {
	logger := hclog.New(&hclog.LoggerOptions{
		Name:       cudallama.Name,
		JSONFormat: true,
		Output:     os.Stderr,
		Level:      hclog.Trace,
	})
	if !cudallama.Linked {
		logger.Error(cudallama.ErrNotLinked.Error())
	}
	iface.Serve(cudallama.New(logger), iface.ServeOptions{Logger: logger, Extend: shm.Extend})
}
