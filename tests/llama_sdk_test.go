//go:build llama

package tests

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/hydra-engine/hydra-engine/plugins/cuda-llama/gguf"
)

// runSDKClient runs tests/DIR/client.mjs, an official SDK's client under
// node, against an engine on the llama plugin with a random-weight model
// carrying Qwen3's real tokenizer and chat template, and returns what the
// client printed. It skips, saying what to install, only where node, the SDK
// (sdkPackage in DIR's node_modules, from make TARGET) or the tokenizer
// (make tokenizers) is missing. base is the engine's HTTP address, serving
// on after the client.
func runSDKClient(t *testing.T, sdk, dir, sdkPackage, target string) (out []byte, base string) {
	t.Helper()
	return runSDKScript(t, sdk, dir, sdkPackage, target, "client.mjs")
}

// runSDKScript is runSDKClient for tests/DIR/SCRIPT, the engine started
// with engineArgs besides.
func runSDKScript(t *testing.T, sdk, dir, sdkPackage, target, script string, engineArgs ...string) (out []byte, base string) {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skipf("node is not installed: the %s Node SDK runs under node", sdk)
	}
	if _, err := os.Stat(filepath.Join(dir, "node_modules", sdkPackage, "package.json")); err != nil {
		t.Skipf("the %s SDK is not installed in tests/%s: make %s (npm)", sdk, dir, target)
	}
	c := withQwen3Tokenizer(t, gguf.TinyMoE())
	model := filepath.Join(t.TempDir(), "qwen3.gguf")
	if err := gguf.WriteFile(model, c); err != nil {
		t.Fatal(err)
	}
	plugin, _ := llamaSetup(t)
	_, base = startHTTPEngine(t, append([]string{"--backend", plugin, "--model", model, "--slots", "1",
		"--backend-opt", "n_threads=2", "--backend-opt", "n_ctx=4096"}, engineArgs...)...)

	cmd := exec.Command(node, filepath.Join(dir, script), base)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if out, err = cmd.Output(); err != nil {
		t.Fatalf("%s: %v: %s %s", script, err, out, stderr.Bytes())
	}
	return out, base
}
