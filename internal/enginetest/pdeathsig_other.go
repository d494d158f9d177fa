//go:build !linux

package enginetest

import "os/exec"

// dieWithParent needs Linux's PR_SET_PDEATHSIG; elsewhere the process
// outlives an interrupted parent.
func dieWithParent(*exec.Cmd) {}
