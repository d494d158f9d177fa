//go:build !linux

package transport

// fchmodSocket does nothing where the kernel does not give a socket file the
// socket's mode at bind(2); Listen's chmod after bind is all there is.
func fchmodSocket(fd uintptr, mode uint32) error { return nil }
