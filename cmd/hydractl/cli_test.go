package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// hydractlRun runs the CLI in process.
func hydractlRun(args ...string) (code int, stdout, stderr string) {
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// commands are every command line's name with its required arguments but
// for --slot, which the slot commands take from the test.
var slotCommands = map[string][]string{
	"meta":      {"meta"},
	"prefill":   {"prefill", "--text", "hi"},
	"decode":    {"decode", "--n", "2"},
	"state get": {"state", "get", "-o", "x.blob"},
	"state put": {"state", "put", "-i", "x.blob"},
	"migrate":   {"migrate", "--to", "tcp://127.0.0.1:1"},
	"bench":     {"bench", "--rounds", "1"},
}

// TestSlotRequired: every command whose usage says --slot S refuses to run
// without it, before dialling anything, rather than using slot 0.
func TestSlotRequired(t *testing.T) {
	f := startFake(t, &fake{blob: []byte("state"), metaNPast: 3, getNPast: 3})
	for name, args := range slotCommands {
		code, out, errOut := hydractlRun(append([]string{"--addr", f.addr}, args...)...)
		want := fmt.Sprintf("hydractl: %s needs --slot S\nRun 'hydractl %s --help' for usage.\n", name, name)
		if code != 2 || out != "" || errOut != want {
			t.Errorf("%s without --slot: exit %d, stdout %q, stderr %q; want exit 2 and %q", name, code, out, errOut, want)
		}
	}
	if ops := f.received(); len(ops) != 0 {
		t.Errorf("the engine was sent %v", ops)
	}
	// Explicit slot 0 is a slot like any other.
	if code, out, errOut := hydractlRun("--addr", f.addr, "meta", "--slot", "0"); code != 0 || !strings.Contains(out, `"slot_id":0`) {
		t.Errorf("meta --slot 0: %d %q %q", code, out, errOut)
	}
}

// TestGlobalFlagsAnywhere: global flags work before the command, after it,
// between "state" and its subcommand, and after positional arguments; "--"
// ends the flags.
func TestGlobalFlagsAnywhere(t *testing.T) {
	f := startFake(t, &fake{blob: []byte("state"), metaNPast: 3, getNPast: 3})
	blob := filepath.Join(t.TempDir(), "s.blob")
	for _, c := range []struct {
		args []string
		want string // in stdout
	}{
		{[]string{"--addr", f.addr, "--trace", "t1", "info"}, `"trace":"t1"`},
		{[]string{"info", "--addr", f.addr, "--trace", "t2"}, `"trace":"t2"`},
		{[]string{"info", "--json", "--addr=" + f.addr}, `"command":"info","meta":{"engine":"fake"`},
		{[]string{"meta", "--slot", "1", "--timeout", "5s", "--addr", f.addr}, `"slot_id":1`},
		{[]string{"configure", `{"state_chunk_size":65536}`, "--addr", f.addr, "--json"}, `"command":"configure"`},
		{[]string{"expert-mode", "combined", "--addr", f.addr}, `"payload":"combined"`},
		{[]string{"swap-quant", "Q6_K", "--addr", f.addr, "blk"}, `"payload":"\x04\x00Q6_Kblk"`},
		{[]string{"swap-quant", "--addr", f.addr, "--", "-k", "--json"}, `"payload":"\x02\x00-k--json"`},
		{[]string{"state", "--addr", f.addr, "--json", "get", "--slot", "0", "-o", blob}, `"command":"state get"`},
		{[]string{"state", "put", "--slot", "2", "-i", blob, "--no-progress", "--json", "--addr", f.addr}, `"command":"state put"`},
		{[]string{"decode", "--slot", "2", "--addr", f.addr, "--json", "--n", "2"}, `"frames":[`},
	} {
		code, out, errOut := hydractlRun(c.args...)
		if code != 0 || !strings.Contains(out, c.want) {
			t.Errorf("hydractl %q: exit %d, stdout %q, stderr %q; want %q", c.args, code, out, errOut, c.want)
		}
	}
}

// TestHelpOnEveryCommand: -h, --help and "help CMD" print that command's
// usage on stdout and exit 0, whatever else is on the line.
func TestHelpOnEveryCommand(t *testing.T) {
	cmds := map[string][]string{
		"info":        {"info"},
		"configure":   {"configure"},
		"expert-mode": {"expert-mode"},
		"swap-quant":  {"swap-quant"},
		"state":       {"state"},
	}
	for name, args := range slotCommands {
		cmds[name] = args
	}
	for name, args := range cmds {
		for _, h := range []string{"-h", "--help", "-help"} {
			code, out, errOut := hydractlRun(append(slices.Clone(args), h)...)
			if code != 0 || !strings.HasPrefix(out, "usage: hydractl "+name) || errOut != "" {
				t.Errorf("%q %s: exit %d, stdout %q, stderr %q", args, h, code, out, errOut)
			}
		}
		// Before the command's other arguments, and with --json: still help.
		code, out, _ := hydractlRun(append([]string{"--json", strings.Fields(name)[0], "--help"}, args[1:]...)...)
		if code != 0 || !strings.HasPrefix(out, "usage: hydractl "+strings.Fields(name)[0]) {
			t.Errorf("--json %s --help: exit %d, %q", name, code, out)
		}
		code, out, errOut := hydractlRun(append([]string{"help"}, strings.Fields(name)...)...)
		if code != 0 || !strings.HasPrefix(out, "usage: hydractl "+name) || errOut != "" {
			t.Errorf("help %s: exit %d, stdout %q, stderr %q", name, code, out, errOut)
		}
	}
	// The command's usage lists its own flags.
	_, out, _ := hydractlRun("state", "get", "--help")
	if !strings.Contains(out, "-o FILE") || !strings.Contains(out, "-slot id") || !strings.Contains(out, "Global flags") {
		t.Errorf("state get --help:\n%s", out)
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		code, out, errOut := hydractlRun(args...)
		if code != 0 || !strings.HasPrefix(out, "usage: hydractl [--addr URL]") || errOut != "" {
			t.Errorf("hydractl %q: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// TestJSONUsageErrors: with --json anywhere on the line, a usage error is
// also one JSON object on stdout, with the error, and the exit status is 2.
func TestJSONUsageErrors(t *testing.T) {
	for _, c := range []struct {
		args    []string
		command string
		err     string
	}{
		{[]string{"--json", "meta"}, "meta", "meta needs --slot S"},
		{[]string{"meta", "--json"}, "meta", "meta needs --slot S"},
		{[]string{"--json", "state", "get", "--slot", "0"}, "state get", "state get needs -o FILE"},
		{[]string{"--json", "frobnicate"}, "frobnicate", `unknown command "frobnicate"`},
		{[]string{"info", "--bogus", "--json"}, "info", "info: flag provided but not defined: -bogus"},
		{[]string{"--json", "--bogus", "info"}, "", "flag provided but not defined: -bogus"},
		{[]string{"--json"}, "", "no command given"},
		{[]string{"--json=true", "configure", "{"}, "configure", "configure: argument is not valid JSON: {"},
		{[]string{"--json", "expert-mode", "Solo"}, "expert-mode", `expert-mode: want solo or combined, got "Solo"`},
	} {
		code, out, errOut := hydractlRun(c.args...)
		var m map[string]any
		if err := json.Unmarshal([]byte(out), &m); err != nil || strings.Count(out, "\n") != 1 {
			t.Errorf("hydractl %q: stdout %q is not one JSON object (%v)", c.args, out, err)
			continue
		}
		cmd, hasCmd := m["command"]
		if code != 2 || m["ok"] != false || m["error"] != c.err || m["usage_error"] != true ||
			(c.command == "") == hasCmd || (hasCmd && cmd != c.command) {
			t.Errorf("hydractl %q: exit %d, %v; want error %q, command %q", c.args, code, m, c.err, c.command)
		}
		if !strings.Contains(errOut, c.err) {
			t.Errorf("hydractl %q: stderr %q lacks the error", c.args, errOut)
		}
	}
	// --json=false turns it off again.
	if code, out, _ := hydractlRun("--json", "meta", "--json=false"); code != 2 || out != "" {
		t.Errorf("--json=false: exit %d, stdout %q", code, out)
	}
}

// TestMigrateRefusesEmptySlot: a source slot with n_past 0 is not migrated,
// and the destination is not even dialled; a source emptied between its
// STATE_META and its STATE_GET is caught before any STATE_PUT.
func TestMigrateRefusesEmptySlot(t *testing.T) {
	dst := startFake(t, &fake{blob: []byte("dst"), metaNPast: 7, getNPast: 7})
	empty := startFake(t, &fake{blob: []byte("MOCKempty"), metaNPast: 0, getNPast: 0})
	code, out, errOut := hydractlRun("migrate", "--from", empty.addr, "--to", dst.addr, "--slot", "1", "--to-slot", "2")
	if code != 1 || out != "" || !strings.Contains(errOut, "source slot 1 is empty (n_past 0, 9 state bytes)") {
		t.Errorf("migrate of an empty slot: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if got := dst.received(); len(got) != 0 {
		t.Errorf("the destination was sent %v", got)
	}
	if got := empty.received(); !slices.Equal(got, []string{"STATE_META 1"}) {
		t.Errorf("the source was sent %v", got)
	}

	// --json reports it too.
	code, out, _ = hydractlRun("--json", "migrate", "--from", empty.addr, "--to", dst.addr, "--slot", "1")
	var m map[string]any
	if json.Unmarshal([]byte(out), &m); code != 1 || m["ok"] != false || !strings.Contains(fmt.Sprint(m["error"]), "is empty") {
		t.Errorf("--json migrate of an empty slot: exit %d, %q", code, out)
	}

	racy := startFake(t, &fake{blob: []byte("state"), metaNPast: 5, getNPast: 0})
	code, _, errOut = hydractlRun("migrate", "--from", racy.addr, "--to", dst.addr, "--slot", "0", "--to-slot", "3")
	if code != 1 || !strings.Contains(errOut, "source slot 0 is empty") {
		t.Errorf("migrate of a slot emptied on the way: exit %d, stderr %q", code, errOut)
	}
	if got := dst.received(); slices.Contains(got, "STATE_PUT 3") {
		t.Errorf("the destination was sent %v", got)
	}

	// A slot with a state migrates.
	src := startFake(t, &fake{blob: []byte("state-bytes"), metaNPast: 4, getNPast: 4})
	code, out, errOut = hydractlRun("migrate", "--from", src.addr, "--to", dst.addr, "--slot", "0", "--to-slot", "3")
	if code != 0 || !strings.Contains(out, `"restored":true,"bytes":11`) {
		t.Errorf("migrate: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	if got := dst.received(); !slices.Contains(got, "STATE_PUT 3") {
		t.Errorf("the destination was sent %v", got)
	}
}

// TestAddrHelpMentionsTLS: every help text of an engine address names the
// tls:// form beside tcp:// and unix://.
func TestAddrHelpMentionsTLS(t *testing.T) {
	texts := map[string]string{}
	_, texts["hydractl --help"], _ = hydractlRun("--help")
	for _, cmd := range [][]string{{"info"}, {"migrate"}, {"state", "get"}} {
		_, texts[strings.Join(cmd, " ")], _ = hydractlRun(append(cmd, "--help")...)
	}
	n := 0
	for name, text := range texts {
		for _, line := range strings.Split(text, "\n") {
			if !strings.Contains(line, "unix://") {
				continue
			}
			n++
			if !strings.Contains(line, "tls://") || !strings.Contains(line, "tcp://") {
				t.Errorf("%s: address help without tls:// or tcp://: %q", name, line)
			}
		}
	}
	if n < 6 { // --addr everywhere, --from and --to
		t.Errorf("found %d address help lines: %v", n, texts)
	}
	fs := newFlagSet(&globals{}, "x", "x")
	if u := fs.Lookup("addr").Usage; !strings.Contains(u, "tls://") {
		t.Errorf("--addr usage %q", u)
	}
}
