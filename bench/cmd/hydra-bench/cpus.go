package main

import (
	"fmt"
	"os/exec"
	"regexp"
	"slices"
)

// --server-cpus: the engines and the raw server process run under
// `taskset -c LIST`, so the receivers can be kept off the client's CPUs
// (run hydra-bench itself under taskset for the client's): on a VM, where the
// kernel places the two ends of a socket is one more thing that differs
// between runs. The plugin inherits its engine's CPUs (enginetest.Command).

var cpuListRE = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)

// checkCPUList validates a taskset CPU list and that taskset is there.
func checkCPUList(list string) error {
	if list == "" {
		return nil
	}
	if !cpuListRE.MatchString(list) {
		return fmt.Errorf("%q is not a CPU list (e.g. 2-15 or 0,2,4-7)", list)
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		return fmt.Errorf("pinning to CPUs %s needs taskset (util-linux): %w", list, err)
	}
	return nil
}

// ownCPUs is this process's CPU affinity as the kernel lists it (0-3,8).
func ownCPUs() string {
	return orUnknown(firstField("/proc/self/status", "Cpus_allowed_list"))
}

// rawInProcNote names the in-process raw server beside the client, which
// runs on the client's CPUs.
func rawInProcNote(raws []string) string {
	if slices.Contains(raws, rawInProc) {
		return ", with the in-process raw server"
	}
	return ""
}
