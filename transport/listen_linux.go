package transport

import "syscall"

// fchmodSocket sets an unbound socket's mode, which bind(2) gives the file.
func fchmodSocket(fd uintptr, mode uint32) error { return syscall.Fchmod(int(fd), mode) }
