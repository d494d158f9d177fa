package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// maxUnixPath is the longest socket path Linux accepts: sun_path holds 108
// bytes including the terminating NUL. Checked up front because bind(2)
// reports only "invalid argument".
const maxUnixPath = 107

// staleProbeTimeout bounds the dial that decides whether an existing socket
// file still has a server behind it.
const staleProbeTimeout = time.Second

// ParseURL splits a transport address into a net network and address.
//
// Accepted forms:
//
//	tcp://host:port   TCP (host may be empty, a name, an IPv4 or a [bracketed] IPv6 address)
//	host:port         the same, for convenience
//	unix:///abs/path  a Unix stream socket at an absolute path
//	tls://host:port   TCP carrying TLS (network "tls"; see WithTLS)
//
// The scheme is case-insensitive. Other schemes are rejected.
func ParseURL(raw string) (network, address string, err error) {
	if raw == "" {
		return "", "", errors.New("transport: empty address (want tcp://host:port, unix:///path or host:port)")
	}
	scheme, rest, hasScheme := strings.Cut(raw, "://")
	if !hasScheme {
		if strings.Contains(raw, "/") {
			return "", "", fmt.Errorf("transport: unrecognised address %q (want tcp://host:port, unix:///path or host:port)", raw)
		}
		scheme, rest = "tcp", raw
	}
	switch strings.ToLower(scheme) {
	case "tcp":
		if err := checkHostPort(rest); err != nil {
			return "", "", fmt.Errorf("transport: address %q: %w", raw, err)
		}
		return "tcp", rest, nil
	case "unix":
		if !strings.HasPrefix(rest, "/") {
			return "", "", fmt.Errorf("transport: address %q: unix socket path must be absolute (unix:///abs/path)", raw)
		}
		if len(rest) > maxUnixPath {
			return "", "", fmt.Errorf("transport: address %q: unix socket path is %d bytes, the limit is %d", raw, len(rest), maxUnixPath)
		}
		return "unix", rest, nil
	case "tls":
		if err := checkHostPort(rest); err != nil {
			return "", "", fmt.Errorf("transport: address %q: %w", raw, err)
		}
		return "tls", rest, nil
	default:
		return "", "", fmt.Errorf("transport: address %q: unknown scheme %q (want tcp, unix or tls)", raw, scheme)
	}
}

// checkHostPort requires an explicit numeric port: an engine listening on a
// port picked by a service-name lookup would surprise everyone.
func checkHostPort(hp string) error {
	if strings.Contains(hp, "/") {
		return errors.New("a tcp address takes no path")
	}
	_, port, err := net.SplitHostPort(hp)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return errors.New(ae.Err)
		}
		return err
	}
	if port == "" {
		return errors.New("missing port")
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("invalid port %q", port)
	}
	return nil
}

// Listen listens on a transport address (see ParseURL).
//
// TCP listeners get Go's defaults: SO_REUSEADDR, and TCP_NODELAY on accepted
// connections. For a Unix socket an existing file at the path is removed first
// only when it is a socket that nobody answers on (left behind by a crashed
// server); a regular file or a live socket is refused. The socket is created
// mode 0600 (restrictSocketMode), since the protocol carries no
// authentication, and the file is removed when the listener is closed.
func Listen(rawURL string, opts ...Option) (net.Listener, error) {
	network, address, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	o := collect(opts)
	if network == "tls" {
		if o.tls == nil || (len(o.tls.Certificates) == 0 && o.tls.GetCertificate == nil) {
			return nil, fmt.Errorf("transport: listen %s: a tls:// listener needs a certificate and key", rawURL)
		}
		l, err := tls.Listen("tcp", address, o.tls)
		if err != nil {
			return nil, fmt.Errorf("transport: listen %s: %w", rawURL, err)
		}
		return l, nil
	}
	if network == "tcp" {
		l, err := net.Listen("tcp", address)
		if err != nil {
			return nil, fmt.Errorf("transport: listen %s: %w", rawURL, err)
		}
		return l, nil
	}
	if err := removeStaleSocket(address); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: restrictSocketMode}
	nl, err := lc.Listen(context.Background(), "unix", address)
	if err != nil {
		return nil, fmt.Errorf("transport: listen %s: %w", rawURL, err)
	}
	l := nl.(*net.UnixListener)
	l.SetUnlinkOnClose(true)
	// On Linux the file was created 0600 already; where the kernel ignores
	// a socket's mode at bind, this closes the window as soon as it can.
	if err := os.Chmod(address, socketMode); err != nil {
		l.Close()
		return nil, fmt.Errorf("transport: listen %s: restrict socket mode: %w", rawURL, err)
	}
	return l, nil
}

// socketMode is a Unix socket's mode: the protocol carries no
// authentication, so only the engine's user may connect.
const socketMode = 0o600

// restrictSocketMode runs between socket(2) and bind(2) (a ListenConfig's
// Control) and sets the socket's mode before its file exists: Linux creates
// the file with the socket's mode less the umask, so no other user ever
// finds it connectable. Unlike a umask set around bind, it changes nothing
// process-wide, so files other goroutines create meanwhile keep their modes.
func restrictSocketMode(_, _ string, rc syscall.RawConn) error {
	var err error
	if cerr := rc.Control(func(fd uintptr) { err = fchmodSocket(fd, socketMode) }); cerr != nil {
		return cerr
	}
	if err != nil {
		return fmt.Errorf("restrict socket mode: %w", err)
	}
	return nil
}

// removeStaleSocket clears the way for a Unix listener at path.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("transport: inspect %s: %w", path, err)
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("transport: refusing to replace %s: it exists and is %s, not a socket", path, fileKind(fi.Mode()))
	}
	c, err := net.DialTimeout("unix", path, staleProbeTimeout)
	if err == nil {
		c.Close()
		return fmt.Errorf("transport: %s is in use: a server answers on it", path)
	}
	// Only "connection refused" proves nobody is bound to the socket; any other
	// failure (permissions, a full backlog) leaves it alone.
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("transport: refusing to remove existing socket %s: probe failed: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("transport: remove stale socket %s: %w", path, err)
	}
	return nil
}

func fileKind(m fs.FileMode) string {
	switch m.Type() {
	case 0:
		return "a regular file"
	case fs.ModeDir:
		return "a directory"
	case fs.ModeSymlink:
		return "a symbolic link"
	default:
		return "a special file (" + m.Type().String() + ")"
	}
}

// Dial connects to a transport address (see ParseURL). ctx bounds the
// connection attempt only.
func Dial(ctx context.Context, rawURL string, opts ...Option) (net.Conn, error) {
	network, address, err := ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	if network == "tls" {
		d := tls.Dialer{Config: collect(opts).tls}
		c, err := d.DialContext(ctx, "tcp", address)
		if err != nil {
			return nil, fmt.Errorf("transport: dial %s: %w", rawURL, err)
		}
		return c, nil
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, network, address)
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", rawURL, err)
	}
	return c, nil
}
