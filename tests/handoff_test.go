package tests

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hydra-engine/hydra-engine/transport"
)

// TestHandoffCutOffs: between two engines whose plugins fill and read the
// export file in place, exports cut off at the source at random points
// (the exporting connection closed mid-transfer) and an import whose plugin
// dies mid-transfer end both sides cleanly: the destination slot holds the
// whole state or nothing, the source's is intact and free again, no file is
// left behind, and neither engine nor the source's plugin keeps a
// descriptor more than it had.
func TestHandoffCutOffs(t *testing.T) {
	dir := t.TempDir()
	opts := []string{"--backend-opt", "kv_bytes_per_token=1048576", "--state-shm-dir", dir}
	a, b := startEngine(t, opts...), startEngine(t, opts...)
	ca, cb := client(t, a.unix), client(t, b.unix)
	mustOK(t, ca, transport.OpPrefill, "0", chat(strings.Repeat("a long conversation ", 8)))
	src, _ := mustOK(t, ca, transport.OpStateMeta, "0", nil)
	nPast := num(t, src, "n_past")
	fds := func() [3]int {
		return [3]int{openFDs(t, a.cmd.Process.Pid), openFDs(t, pluginPID(t, a)), openFDs(t, b.cmd.Process.Pid)}
	}
	before := fds()

	// exportAndImport exports slot 0 of a on a connection of its own and
	// imports it into slot 1 of b, doing cut while the import runs; it
	// returns whether the import restored the slot, and its reply.
	exportAndImport := func(cut func(exp *transport.Client)) (bool, map[string]any) {
		exp := client(t, a.unix)
		em, _ := mustOK(t, exp, transport.OpStateExport, "0", nil)
		payload, _ := json.Marshal(map[string]any{"path": em["path"], "bytes": em["bytes"]})
		type result struct {
			st   transport.Status
			meta map[string]any
			err  error
		}
		done := make(chan result, 1)
		go func() {
			resp, _, err := cb.Call(ctxT(t), transport.OpStateImport, "1", payload)
			var m map[string]any
			if err == nil {
				json.Unmarshal(resp.Meta, &m)
				done <- result{resp.Status, m, nil}
				return
			}
			done <- result{err: err}
		}()
		cut(exp)
		r := <-done
		if r.err != nil {
			t.Fatalf("STATE_IMPORT: %v", r.err)
		}
		exp.Close()
		return r.st == transport.StatusOK, r.meta
	}
	// checkSlots: the destination holds the whole state or nothing; the
	// source is intact and free.
	checkSlots := func(trial string, restored bool, reply map[string]any) {
		t.Helper()
		dm, _ := mustOK(t, cb, transport.OpStateMeta, "1", nil)
		if got := num(t, dm, "n_past"); (restored && got != nPast) || (!restored && got != 0) {
			t.Fatalf("%s: restored %v (%v), the destination slot holds %d tokens of %d", trial, restored, reply, got, nPast)
		}
		waitFor(t, 10*time.Second, "free source slot", func() bool {
			m, _ := mustOK(t, ca, transport.OpStateMeta, "0", nil)
			return m["is_transferring"] == false
		})
		if m, _ := mustOK(t, ca, transport.OpStateMeta, "0", nil); num(t, m, "n_past") != nPast {
			t.Fatalf("%s: the source slot holds %v tokens, had %d", trial, m["n_past"], nPast)
		}
	}

	rng := rand.New(rand.NewPCG(7, 8))
	cuts := 0
	for i := range 12 {
		delay := time.Duration(rng.IntN(200)) * time.Millisecond
		restored, reply := exportAndImport(func(exp *transport.Client) { time.Sleep(delay); exp.Close() })
		if !restored {
			cuts++
			if e := fmt.Sprint(reply["error"]); !strings.Contains(e, "cut off at its source") && !strings.Contains(e, "stopped") {
				t.Errorf("trial %d: an import cut off at its source says %q", i, e)
			}
		}
		checkSlots(fmt.Sprintf("trial %d (cut after %v)", i, delay), restored, reply)
	}
	if cuts == 0 {
		t.Fatal("no export was cut off mid-transfer: the trials tested nothing")
	}

	// The destination's plugin dies mid-import: the import fails, and the
	// export stops because its importer gave up.
	old := pluginPID(t, b)
	restored, reply := exportAndImport(func(*transport.Client) {
		time.Sleep(5 * time.Millisecond)
		syscall.Kill(old, syscall.SIGKILL)
	})
	if restored {
		t.Fatalf("an import whose plugin died: %v", reply)
	}
	waitRelaunch(t, b, old)
	checkSlots("the destination's plugin killed", false, reply)

	waitFor(t, 10*time.Second, "export files removed", func() bool {
		left, _ := filepath.Glob(filepath.Join(dir, "*"))
		return len(left) == 0
	})
	waitFor(t, 10*time.Second, "descriptors back to their count", func() bool {
		now := fds()
		return now[0] <= before[0] && now[1] <= before[1] && now[2] <= before[2]+2 // b's new plugin's pipes
	})
	t.Logf("%d of 12 exports cut off mid-transfer", cuts)
}
