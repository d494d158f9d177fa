package enginetest

import (
	"os/exec"
	"syscall"
)

// dieWithParent has the kernel send cmd's process SIGTERM when the thread
// that started it exits.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
