package tests

// The Hydra node configurations as they are (the Hydra repository's
// infra/hydra-head/config at the commit tests/testdata/hydra-head/ORIGIN
// names, which make hydra-head extracts beside the agent's source: the
// files are the Hydra repository's and are read from there, not copied into
// this one) run under the real node agent, hydra-head (built from the same
// commit), with this engine put where each names its binary: as
// llama-engine on node-rtx and node-rtx3060, as llama-server on node-p100,
// on the mock backend. The configurations the test runs differ from the
// originals only by the edits editNodeConfig makes and TestNodeConfigEdits
// checks: the paths of binaries, models and templates moved under the
// test's root, the ports the test picks, and the one line an operator adds
// (rpc-allow). docs/llama-server.md, Moving a node from llama-engine, is
// the operator's side of this.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/internal/enginetest"
	"github.com/hydra-engine/hydra-engine/transport"
)

// nodeFiles are the configurations: global.yaml beneath each node's.
var nodeFiles = []string{"global.yaml", "node-rtx.yaml", "node-rtx3060.yaml", "node-p100.yaml"}

// hydraHead is the node agent's binary: $HYDRA_HEAD (make sets it, and then
// it must be there), else ../bin/hydra-head, else the test is skipped,
// saying how to build it.
func hydraHead(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("HYDRA_HEAD"); p != "" {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("HYDRA_HEAD: %v", err)
		}
		return p
	}
	p, err := filepath.Abs("../bin/hydra-head")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(p); err != nil {
		t.Skip("bin/hydra-head is not built: make hydra-head builds it (HYDRA_VORTEX=PATH for a local clone of the Hydra repository)")
	}
	return p
}

// The edits a test configuration may carry, line for line against the
// original: a binary's, model's or template's absolute path moved under
// ${ROOT}, a port given as ${HTTP_PORT}, ${RPC_PORT} or ${LEND_PORT} (the
// COMBINED peer's, llama-engine's --ggml-rpc-port) and the head's peer
// address as localhost:${PEER_PORT}, and, in global.yaml alone, the line an
// operator adds for Hydra RPC on --host 0.0.0.0.
var (
	pathKeys  = []string{"binary", "dest", "working_dir", "model", "chat-template-file"}
	portKeys  = map[string]string{"port": "${HTTP_PORT}", "rpc_port": "${RPC_PORT}", "ggml-rpc-port": "${LEND_PORT}"}
	peerKey   = "rpc-engine"
	peerValue = `"localhost:${PEER_PORT}"`
	addedLine = map[string]string{"global.yaml": "    rpc-allow: 127.0.0.1"}
)

// nodeConfig is the Hydra repository's configuration name (HYDRA_HEAD_CONFIG,
// which make sets beside HYDRA_HEAD) and the test's edit of it; the test is
// skipped, saying how to get them, where they are not there.
func nodeConfig(t *testing.T, name string) (orig, edited string) {
	t.Helper()
	dir := os.Getenv("HYDRA_HEAD_CONFIG")
	if dir == "" {
		t.Skip("HYDRA_HEAD_CONFIG is not set: make hydra-head extracts the Hydra repository's node configurations (make unit and race pass it on)")
	}
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b), editNodeConfig(name, string(b))
}

// editNodeConfig makes the test's edits of a configuration, line by line: in
// a node's binaries and llama blocks (the engine and what it loads; not the
// exporters' services, which the test does not run, nor global.yaml's
// defaults, which the nodes override), an absolute path of a pathKeys key
// moves under ${ROOT} and a port key's number becomes its placeholder; in
// global.yaml the operator's rpc-allow line goes after the llama parameters'
// last one.
func editNodeConfig(name, text string) string {
	var out []string
	edit := false
	for _, line := range strings.Split(text, "\n") {
		if line != "" && line[0] != ' ' && line[0] != '#' {
			block, _, _ := strings.Cut(line, ":")
			edit = name != "global.yaml" && (block == "binaries" || block == "llama")
		}
		indent := line[:len(line)-len(strings.TrimLeft(line, " "))]
		key, after, ok := strings.Cut(strings.TrimSpace(line), ": ")
		value, rest, _ := strings.Cut(after, " ")
		switch {
		case !ok || !edit:
		case slices.Contains(pathKeys, key) && strings.HasPrefix(value, "/"):
			line = indent + key + ": ${ROOT}" + value + cutSuffix(rest)
		case portKeys[key] != "":
			if _, err := strconv.Atoi(value); err == nil {
				line = indent + key + ": " + portKeys[key] + cutSuffix(rest)
			}
		case key == peerKey && strings.HasPrefix(value, `"localhost:`):
			line = indent + key + ": " + peerValue + cutSuffix(rest)
		}
		out = append(out, line)
		if added := addedLine[name]; added != "" && line == "    context-shift: true" {
			out = append(out, added)
		}
	}
	return strings.Join(out, "\n")
}

// cutSuffix is what followed a value on its line, with the space that
// separated them.
func cutSuffix(rest string) string {
	if rest == "" {
		return ""
	}
	return " " + rest
}

// TestNodeConfigEdits: the configurations the test runs are the originals
// but for the allowed edits (the diff is in the test's log, go test -v).
func TestNodeConfigEdits(t *testing.T) {
	for _, name := range nodeFiles {
		orig, edited := nodeConfig(t, name)
		ops := diffLines(strings.Split(orig, "\n"), strings.Split(edited, "\n"))
		t.Logf("%s:\n%s", name, formatDiff(ops))
		added := 0
		for _, h := range hunks(ops) {
			var removed, inserted []string
			for _, op := range h {
				if op.kind == '-' {
					removed = append(removed, op.line)
				} else {
					inserted = append(inserted, op.line)
				}
			}
			for i, line := range inserted {
				switch {
				case i < len(removed):
					if why := allowedEdit(removed[i], line); why != "" {
						t.Errorf("%s: %q → %q: %s", name, removed[i], line, why)
					}
				case line == addedLine[name]:
					added++
				default:
					t.Errorf("%s: added line %q is not an allowed edit", name, line)
				}
			}
			if len(removed) > len(inserted) {
				t.Errorf("%s: lines removed: %q", name, removed[len(inserted):])
			}
		}
		if want := len(addedLine[name]) > 0; (added == 1) != want {
			t.Errorf("%s: %d added lines, want %v", name, added, want)
		}
	}
}

// allowedEdit is "" when edited is orig with an allowed edit, else why not.
func allowedEdit(orig, edited string) string {
	indent := func(s string) string { return s[:len(s)-len(strings.TrimLeft(s, " "))] }
	if indent(orig) != indent(edited) {
		return "the indentation changed"
	}
	split := func(s string) (key, value, rest string) {
		key, after, _ := strings.Cut(strings.TrimSpace(s), ": ")
		value, rest, _ = strings.Cut(after, " ")
		return key, value, rest
	}
	key, value, rest := split(orig)
	ekey, evalue, erest := split(edited)
	switch {
	case key != ekey || rest != erest:
		return "not the same key, or more than its value changed"
	case slices.Contains(pathKeys, key) && strings.HasPrefix(value, "/") && evalue == "${ROOT}"+value:
		return ""
	case portKeys[key] != "" && evalue == portKeys[key]:
		if _, err := strconv.Atoi(value); err != nil {
			return "not a port number before"
		}
		return ""
	case key == peerKey && evalue == peerValue && strings.HasPrefix(value, `"localhost:`):
		return ""
	}
	return "only a path moved under ${ROOT} or a port as " + portKeys["port"] + "/" + portKeys["rpc_port"] + " may change"
}

// lineOp is one line of a diff: ' ' kept, '-' removed, '+' added.
type lineOp struct {
	kind byte
	line string
}

// diffLines is a shortest edit script from a to b (longest common
// subsequence; the files are a few hundred lines).
func diffLines(a, b []string) []lineOp {
	lcs := make([][]int, len(a)+1)
	for i := range lcs {
		lcs[i] = make([]int, len(b)+1)
	}
	for i := len(a) - 1; i >= 0; i-- {
		for j := len(b) - 1; j >= 0; j-- {
			if a[i] == b[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	var ops []lineOp
	i, j := 0, 0
	for i < len(a) || j < len(b) {
		switch {
		case i < len(a) && j < len(b) && a[i] == b[j]:
			ops = append(ops, lineOp{' ', a[i]})
			i, j = i+1, j+1
		case i < len(a) && (j == len(b) || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, lineOp{'-', a[i]})
			i++
		default:
			ops = append(ops, lineOp{'+', b[j]})
			j++
		}
	}
	return ops
}

// hunks are the runs of changed lines.
func hunks(ops []lineOp) [][]lineOp {
	var out [][]lineOp
	var cur []lineOp
	for _, op := range ops {
		if op.kind == ' ' {
			if len(cur) > 0 {
				out = append(out, cur)
			}
			cur = nil
			continue
		}
		cur = append(cur, op)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// formatDiff shows the changed lines, each with its line number: in the
// original for a removed one, in the test's file for an added one.
func formatDiff(ops []lineOp) string {
	var b strings.Builder
	old, cur := 0, 0
	for _, op := range ops {
		switch op.kind {
		case ' ':
			old, cur = old+1, cur+1
		case '-':
			old++
			fmt.Fprintf(&b, "%4d - %s\n", old, op.line)
		case '+':
			cur++
			fmt.Fprintf(&b, "%4d + %s\n", cur, op.line)
		}
	}
	return b.String()
}

// headNode is one node agent running one node's configuration.
type headNode struct {
	name              string
	cmd               *exec.Cmd
	logs              *enginetest.Log
	root              string
	httpPort, rpcPort int
	apiPort           int
	started           time.Time // when hydra-head was started
	exited            chan error
}

// chatTemplateML is the nodes' chat template stand-in (the mock renders
// its own prompt; the engine checks the file is readable).
const chatTemplateML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"

// startNode writes the node's configuration (global.yaml beneath it) with
// the test's root and ports, makes the files it names under the root (the
// engine where a binary is named, stand-ins for the exporters, a model
// file, the template), and runs hydra-head on it with env added to the
// environment (HYDRA_BACKEND=mock always). hydra-head is stopped, if it
// still runs, when the test ends.
func startNode(t *testing.T, node string, env ...string) *headNode {
	t.Helper()
	head := hydraHead(t)
	n := &headNode{name: node, logs: enginetest.NewLog(0), root: t.TempDir(), exited: make(chan error, 1),
		httpPort: freePort(t), rpcPort: freePort(t), apiPort: freePort(t)}
	// Each node lends on a port of its own but the COMBINED peer's
	// (rtx3060), which every rtx head follows.
	lend := freePort(t)
	if node == "rtx3060" {
		lend = combinedPeerPort()
	}
	vars := map[string]string{"${ROOT}": n.root, "${HTTP_PORT}": fmt.Sprint(n.httpPort), "${RPC_PORT}": fmt.Sprint(n.rpcPort),
		"${LEND_PORT}": fmt.Sprint(lend), "${PEER_PORT}": fmt.Sprint(combinedPeerPort())}
	cfgDir := filepath.Join(n.root, "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"global.yaml", "node-" + node + ".yaml"} {
		_, text := nodeConfig(t, name)
		for k, v := range vars {
			text = strings.ReplaceAll(text, k, v)
		}
		if strings.Contains(text, "${") {
			t.Fatalf("%s: a placeholder the test does not fill", name)
		}
		for line := range strings.Lines(text) {
			key, value, _ := strings.Cut(strings.TrimSpace(line), ": ")
			if value, _, _ = strings.Cut(value, " "); strings.HasPrefix(value, n.root) {
				n.makeFile(t, key, value)
			}
		}
		if err := os.WriteFile(filepath.Join(cfgDir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	n.cmd = exec.Command(head, "-global", filepath.Join(cfgDir, "global.yaml"), "-node", filepath.Join(cfgDir, "node-"+node+".yaml"),
		"-api-port", fmt.Sprint(n.apiPort))
	n.cmd.Dir = n.root
	n.cmd.Stdout, n.cmd.Stderr = n.logs, n.logs
	n.cmd.Env = append(append(os.Environ(), "HYDRA_BACKEND=mock"), env...)
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	n.started = time.Now()
	go func() { n.exited <- n.cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-n.exited:
			n.exited <- err
		default:
			_ = n.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-n.exited:
			case <-time.After(30 * time.Second):
				_ = n.cmd.Process.Kill()
			}
		}
		if t.Failed() {
			t.Logf("HYDRA-HEAD LOG (node %s)\n%s", node, n.logs)
		}
	})
	return n
}

// combinedPeerPort is the port the rtx3060 node lends on, chosen once.
var combinedPeerPort = sync.OnceValue(func() int {
	p, err := enginetest.FreePort()
	if err != nil {
		panic(err)
	}
	return p
})

// makeFile makes what a configuration line names under the root.
func (n *headNode) makeFile(t *testing.T, key, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	var err error
	switch base := filepath.Base(path); {
	case key == "working_dir":
		err = os.MkdirAll(path, 0o755)
	case base == "llama-engine" || base == "llama-server": // the engine, under the name the node runs
		if _, serr := os.Lstat(path); serr != nil {
			err = os.Symlink(filepath.Join(binDir, "hydra-engine"), path)
		}
	case key == "dest": // an exporter's binary: there, so hydra-head pulls nothing; never run
		err = os.WriteFile(path, []byte("stand-in: not run by the test\n"), 0o644)
	case key == "model":
		err = os.WriteFile(path, []byte("mock model "+base+"\n"), 0o644)
	case key == "chat-template-file":
		err = os.WriteFile(path, []byte(chatTemplateML), 0o644)
	default:
		t.Fatalf("%s: %s names a file the test does not make", key, path)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// base is the engine's HTTP side as hydra-head's health checker reaches it:
// http://HOST:PORT with the configuration's host, 0.0.0.0.
func (n *headNode) base() string { return fmt.Sprintf("http://0.0.0.0:%d", n.httpPort) }

// status is hydra-head's GET /status.
type headStatus struct {
	Processes map[string]struct {
		PID          int    `json:"pid"`
		State        string `json:"state"`
		RestartCount int    `json:"restart_count"`
		LastExitCode int    `json:"last_exit_code"`
	} `json:"processes"`
	Health struct {
		Healthy bool `json:"healthy"`
	} `json:"health"`
}

// status is hydra-head's GET /status, once its API answers (it starts
// serving after it has started the engine).
func (n *headNode) status(t *testing.T) headStatus {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d/status", n.apiPort)
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get(url)
		if err == nil {
			defer resp.Body.Close()
			var st headStatus
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != 200 {
				t.Fatalf("GET %s: %d %v", url, resp.StatusCode, err)
			}
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
	}
}

// waitHealthy waits until the engine hydra-head started answers /health
// 200 and returns its pid and its plugin's.
func (n *headNode) waitHealthy(t *testing.T) (engine, plugin int) {
	t.Helper()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if resp, err := http.Get(n.base() + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case err := <-n.exited:
			n.exited <- err
			t.Fatalf("hydra-head exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("the engine under hydra-head is not healthy after 60s")
		}
	}
	st := n.status(t)
	llama := st.Processes["llama"]
	if llama.State != "running" || llama.PID == 0 || llama.RestartCount != 0 || !st.Health.Healthy {
		t.Fatalf("hydra-head /status: %+v", st)
	}
	kids := children(llama.PID)
	if len(kids) != 1 {
		t.Fatalf("engine %d has child processes %v, want its plugin", llama.PID, kids)
	}
	return llama.PID, kids[0]
}

// slotStatus is what hydra-head's health checker decodes /slots into
// (src/head/internal/health/checker.go's SlotStatus).
type slotStatus struct {
	ID           int  `json:"id"`
	IsProcessing bool `json:"is_processing"`
	NPast        int  `json:"n_past"`
	NRemain      int  `json:"n_remain"`
}

// slotsProbes is how many times the engine has answered GET /slots 200,
// from its metrics.
func (n *headNode) slotsProbes(t *testing.T) int {
	t.Helper()
	_, b, _ := httpDo(t, "GET", n.base()+"/metrics", "")
	m := regexp.MustCompile(`(?m)^hydra_engine_http_requests_total\{code="200",handler="GET /slots"\} (\d+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, _ := strconv.Atoi(string(m[1]))
	return v
}

// stop sends hydra-head SIGTERM, as its service manager stops it, and
// returns how long the engine took to exit.
func (n *headNode) stop(t *testing.T, engine int) time.Duration {
	t.Helper()
	start := time.Now()
	if err := n.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	for processAlive(engine) {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("engine %d alive 20s after hydra-head's SIGTERM", engine)
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(start)
	select {
	case err := <-n.exited:
		n.exited <- err
		if err != nil {
			t.Errorf("hydra-head exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Error("hydra-head did not exit")
	}
	return took
}

// engineExit is the exit code hydra-head logged for its llama child.
func (n *headNode) engineExit(t *testing.T, engine int) string {
	t.Helper()
	m := regexp.MustCompile(fmt.Sprintf(`process exited name="llama" pid="%d" exit_code="(-?\d+)"`, engine)).FindStringSubmatch(n.logs.String())
	if m == nil {
		t.Fatalf("hydra-head logged no exit of engine %d", engine)
	}
	return m[1]
}

// nodeCase is a node configuration as the test runs it.
type nodeCase struct {
	node  string
	slots int
	model string
	logs  []string // lines the engine's start-up says, once each
}

var nodeCases = []nodeCase{
	{"rtx", 2, "Qwopus3.6-35B-A3B-v1-APEX-I-Mini", []string{
		": lending this engine's weights to combined heads of this host on 127.0.0.1:",
		"[INFO]  hydra-engine: combined mode: following the peer engine: peer=localhost:",
		`[INFO]  hydra-engine: llama-engine --combined-ot-pattern blk\.([0-9]+)\.ffn_.*_exps\.weight=CPU: passed to the plugin as combined_pattern`,
		"[INFO]  hydra-engine: environment LLAMA_CHAT_TEMPLATE_KWARGS: no effect here",
	}},
	{"rtx3060", 1, "Qwopus3.6-35B-A3B-v1-APEX-I-Mini", []string{
		": lending this engine's weights to combined heads of this host on 127.0.0.1:",
		"[INFO]  hydra-engine: environment LLAMA_CHAT_TEMPLATE_KWARGS: no effect here",
	}},
	{"p100", 1, "Qwopus3.6-35B-A3B-v1-APEX-I-Balanced", nil},
}

// The three nodes, each under its own hydra-head: the engine starts from
// the configuration verbatim, serves what the agent and the coordinator
// ask of it, passes the agent's own health probe, and stops within the
// agent's 10 s with exit status 0 and no plugin left. The nodes start
// together, first, since the agent's checker probes only 60 s after its
// start; the stop cases run meanwhile.
func TestNodesUnderHydraHead(t *testing.T) {
	hydraHead(t)
	nodes := map[string]*headNode{}
	for _, tc := range nodeCases {
		nodes[tc.node] = startNode(t, tc.node)
	}
	// Work in progress when the agent stops the node is cut within its
	// 10 s, the client told why.
	t.Run("rtx stopped with a stream in progress", func(t *testing.T) {
		n := startNode(t, "rtx", "HYDRA_BACKEND_OPTS=op_delay_ms=50")
		engine, plugin := n.waitHealthy(t)
		resp, err := http.Post(n.base()+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"messages":[{"role":"user","content":"Hi"}],"max_tokens":100000,"stream":true}`))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("stream: %v %v", resp, err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
		streamEnd := make(chan string, 1)
		go func() { rest, _ := io.ReadAll(br); streamEnd <- string(rest) }()
		took := n.stop(t, engine)
		rest := <-streamEnd
		events := strings.Split(strings.TrimSpace(rest), "\n\n")
		if last := events[len(events)-1]; !strings.Contains(last, `"code":"shutting_down"`) {
			t.Errorf("the stream's last event: %s", last)
		}
		if code := n.engineExit(t, engine); code != "1" || took >= 10*time.Second || strings.Contains(n.logs.String(), "did not exit gracefully") {
			t.Errorf("engine exit %s, %v after hydra-head's SIGTERM; want 1 (work cut) within its 10s", code, took)
		}
		if processAlive(plugin) {
			t.Errorf("plugin %d outlived the engine", plugin)
		}
		t.Logf("stream cut and engine stopped %v after hydra-head's SIGTERM, exit status 1", took.Round(time.Millisecond))
	})
	// An engine that does not stop (SIGSTOP) is killed by the agent at
	// 10 s, and its plugin dies with it.
	t.Run("rtx with a hung engine", func(t *testing.T) {
		n := startNode(t, "rtx")
		engine, plugin := n.waitHealthy(t)
		if err := syscall.Kill(engine, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		took := n.stop(t, engine)
		if code := n.engineExit(t, engine); code != "-1" || took < 10*time.Second || !strings.Contains(n.logs.String(), "did not exit gracefully, killing") {
			t.Errorf("engine exit %s after %v; want hydra-head's SIGKILL at 10s", code, took)
		}
		for deadline := time.Now().Add(5 * time.Second); processAlive(plugin); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				_ = syscall.Kill(plugin, syscall.SIGKILL)
				t.Fatalf("plugin %d outlived its killed engine", plugin)
			}
		}
		t.Logf("hung engine killed by hydra-head %v after SIGTERM; its plugin died with it", took.Round(time.Millisecond))
	})
	for _, tc := range nodeCases {
		t.Run(tc.node, func(t *testing.T) { checkNode(t, nodes[tc.node], tc) })
	}
}

// checkNode checks one node under hydra-head, then stops it.
func checkNode(t *testing.T, n *headNode, tc nodeCase) {
	engine, plugin := n.waitHealthy(t)
	ours := 0 // the /slots requests the test makes

	// /slots as the agent's checker reads it.
	code, body, _ := httpDo(t, "GET", n.base()+"/slots", "")
	ours++
	var slots []slotStatus
	if err := json.Unmarshal(body, &slots); code != 200 || err != nil || len(slots) != tc.slots {
		t.Fatalf("/slots: %d %s (%v), want %d slots", code, body, err, tc.slots)
	}

	// Hydra RPC where rpc_port says: INFO, and SET_EXPERT_MODE "combined"
	// answered truthfully ("solo").
	c := client(t, fmt.Sprintf("tcp://127.0.0.1:%d", n.rpcPort))
	info, _ := mustOK(t, c, transport.OpInfo, "0", nil)
	caps, _ := json.Marshal(info["capabilities"])
	if num(t, info, "n_slots") != int64(tc.slots) || info["backend"] != "mock" || info["model_alias"] != tc.model ||
		info["mode"] != "solo" || info["rpc_backend_active"] != (tc.node != "p100") || strings.Contains(string(caps), "combined") {
		t.Errorf("INFO %v", info)
	}
	// The mock lends no weights: the rtx head's combined is answered solo,
	// with the reason, and peer_connected false (the coordinator's refusal).
	st, m, _ := call(t, c, transport.OpSetExpertMode, "0", []byte("combined"))
	if st != transport.StatusOK || m["mode"] != "solo" || m["success"] != true || (tc.node == "rtx" && m["peer_connected"] != false) {
		t.Errorf("SET_EXPERT_MODE combined: %v %v", st, m)
	}

	// A chat completion, as the coordinator sends one.
	code, body, _ = httpDo(t, "POST", n.base()+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hi"}],"max_tokens":4}`)
	if code != 200 || !strings.Contains(string(body), `"choices"`) {
		t.Errorf("chat completion: %d %s", code, body)
	}

	// The start-up said what does not act, once each.
	logs := n.logs.String()
	for _, want := range append(tc.logs, "options of the llama plugin, no effect on the mock: ",
		fmt.Sprintf("serving Hydra RPC: url=tcp://0.0.0.0:%d", n.rpcPort)) {
		if strings.Count(logs, want) != 1 {
			t.Errorf("the log has %d lines with %q", strings.Count(logs, want), want)
		}
	}
	if tc.node == "rtx" && !strings.Contains(logs, "SET_EXPERT_MODE combined answered solo: this engine lends no weights: ") &&
		!strings.Contains(logs, "SET_EXPERT_MODE combined answered solo: the peer localhost:") {
		t.Error("SET_EXPERT_MODE combined: no log line saying why solo")
	}
	for _, bad := range []string{"unknown parameter", "[ERROR]", "attempting restart"} {
		if strings.Contains(logs, bad) {
			t.Errorf("the log has %q", bad)
		}
	}

	// The agent's own probe: its checker's first comes 60 s after its
	// start (interval_idle_sec), answered 200.
	for deadline := n.started.Add(90 * time.Second); n.slotsProbes(t) <= ours; time.Sleep(250 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("hydra-head's health checker did not probe /slots within 90s")
		}
	}
	if logs := n.logs.String(); strings.Contains(logs, "health check failed") || !n.status(t).Health.Healthy {
		t.Fatal("hydra-head's health check failed")
	}
	t.Logf("hydra-head's checker probed /slots %v after hydra-head started", time.Since(n.started).Round(time.Second))

	took := n.stop(t, engine)
	if code := n.engineExit(t, engine); code != "0" || took >= 10*time.Second || strings.Contains(n.logs.String(), "did not exit gracefully") {
		t.Errorf("engine exit %s, %v after hydra-head's SIGTERM; want 0 within its 10s", code, took)
	}
	if processAlive(plugin) {
		t.Errorf("plugin %d outlived the engine", plugin)
	}
	t.Logf("stopped by hydra-head in %v, exit status 0", took.Round(time.Millisecond))
}
