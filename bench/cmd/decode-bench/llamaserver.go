package main

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
)

// llamaServer is llama.cpp's own server built from the plugin's tree (make
// llama-server: shared libraries, backends loaded from its directory, where
// the GPU run puts the CUDA library built from the same tree), the server a
// user choosing instead of us would run: the same model file, slots = -np,
// one KV pool (--kv-unified, as ours), its completion API on a free
// loopback port.
type llamaServer struct {
	*proc
	args []string
	ep   *endpoint
}

// llamaServerArgs is its command line for o: every setting ours gets, under
// llama-server's names.
func llamaServerArgs(o options, port int) []string {
	a := []string{
		"-m", o.model, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"-np", strconv.Itoa(o.slots), "-c", strconv.Itoa(o.slots * o.ctx), "--kv-unified",
		"-t", strconv.Itoa(o.threads), "-tb", strconv.Itoa(o.threads),
		"-fa", o.flashAttn, "-ngl", strconv.Itoa(llamaServerLayers(o.ngl)),
	}
	// The alias stays last: the endpoint's model name is read from there.
	a = append(a, specLlamaServer(o)...)
	return append(a, "--no-webui", "--alias", strings.TrimSuffix(filepath.Base(o.model), ".gguf"))
}

// llamaServerLayers is -ngl for ours' n_gpu_layers: -1 (all) is a count
// above any model's, since llama-server at this commit takes a number only.
func llamaServerLayers(ngl int) int {
	if ngl < 0 {
		return 999
	}
	return ngl
}

func startLlamaServer(ctx context.Context, o options, ap api) (*llamaServer, error) {
	port, err := enginetest.FreePort()
	if err != nil {
		return nil, err
	}
	s := &llamaServer{args: llamaServerArgs(o, port)}
	if s.proc, err = startProc("llama-server", o.llamaServer, s.args, inheritedEnv(), filepath.Join(o.work, "llama-server.log")); err != nil {
		return nil, err
	}
	s.ep = &endpoint{base: fmt.Sprintf("http://127.0.0.1:%d", port), model: s.args[len(s.args)-1], api: ap, http: newHTTPClient()}
	if err := s.waitHealthy(ctx); err != nil {
		_ = s.stop()
		return nil, err
	}
	return s, nil
}

// waitHealthy polls GET /health until the model is loaded (200; 503 while
// loading).
func (s *llamaServer) waitHealthy(ctx context.Context) error {
	deadline := time.Now().Add(loadTimeout)
	for time.Now().Before(deadline) {
		select {
		case <-s.done:
			return fmt.Errorf("llama-server exited while loading: %s", tail(s.logText(), 2000))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.ep.base+"/health", nil)
		if resp, err := s.ep.http.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
	}
	return fmt.Errorf("llama-server not healthy after %v", loadTimeout)
}

func (s *llamaServer) endpoint() *endpoint { return s.ep }

func (s *llamaServer) settings() []string {
	return []string{"llama-server " + strings.Join(s.args, " ")}
}

func (s *llamaServer) logTail() string { return tail(s.logText(), 4000) }

// llamaServerFacts are what its log says of where it ran: the devices and
// the offload.
func llamaServerFacts(log string) []string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, "offloaded") || strings.Contains(line, "using device") || strings.Contains(line, "build:") {
			out = append(out, strings.TrimSpace(line))
		}
		if len(out) >= 6 {
			break
		}
	}
	return out
}
