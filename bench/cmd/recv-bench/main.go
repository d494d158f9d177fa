// Command recv-bench measures how fast a Go process receives a file sent
// over TCP loopback (sendfile) with the receive loops the engine's STATE_PUT
// could use, each receiver in a child process of its own, variants
// alternating so that noise from the machine hits them alike. It separates
// what the host's ring mechanics cost from what a plugin beside it costs
// (bench/notes.md, 22):
//
//	recv-bench [-n 8] [-net tcp|unix] [-sockbuf N] [-variants serve,ring-4x2048,...] FILE
//
// Over TCP the sender uses sendfile; over a Unix socket (-net unix) it copies
// the file through a 1 MiB buffer, as hydra-bench's client does, and the
// receiver's end gets the engine's 4 MiB socket buffers. On a Unix socket
// what the sender may have in flight is its own send buffer (-sockbuf; the
// kernel's default, ~208 KiB, unless asked). Each variant's line gives the
// receiver's and the sender's CPU seconds per GB over all its transfers.
//
// Variants:
//
//	serve        one 4 MiB buffer, every read at its start (hydra-bench's raw server)
//	serve-seq    the same buffer, each read after the last one, wrapping
//	serve-shm    serve with the buffer in a memfd mapping, as the host's ring
//	ring-NxK     io.ReadFull of N slots of K KiB in turn, as the host fills its
//	             shm ring: a memfd mapping, a read deadline armed before every
//	             read and a 16-byte datagram per slot; suffixes -heap (Go
//	             memory), -thp / -nothp (anonymous memory with
//	             MADV_HUGEPAGE / MADV_NOHUGEPAGE: does a copy into 4 KiB pages
//	             cost the receive loop?), -nodl (no deadline), -nomsg (no
//	             datagram) drop one;
//	             -lowatN sets SO_RCVLOWAT to N KiB (less for a payload's
//	             tail), so the reader wakes for N KiB at least, not each segment
//	             (the -poll and -warmN fills of earlier versions, with the
//	             engine's ring warming they measured, are gone: bench/notes.md
//	             23 and 45 record what they showed)
//	hot-NxK      reads into a 256 KiB buffer, each copied into the ring's slot
//	pipe-N       splices the socket into N pipes of 1 MiB (at most half a pipe
//	             a call, as the host's piped STATE_PUT), a consumer goroutine
//	             reading them into a 16 MiB buffer as the llama plugin's
//	             restore ring does; with N > 1 the pipes take 512 KiB segments
//	             in turn and a datagram says each segment is complete, so the
//	             consumer reads a pipe the splicer is not filling (-nomsg:
//	             the consumer reads each segment as it arrives, no datagrams;
//	             -relay: the consumer copies into a ring of 4 × 2 MiB in
//	             shared memory, a 16-byte datagram a slot, and learns of the
//	             segments through a channel: the host's ring fill, its copy
//	             moved off the thread that reads the socket)
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/hydra-engine/hydra-engine/bench/internal/proccpu"
	"github.com/hydra-engine/hydra-engine/host"
)

const rawBuf = 4 << 20

type variant struct {
	name        string
	ring        bool // a ring of slots instead of one buffer
	seq         bool // serve-seq
	shm         bool // serve-shm
	hot         bool
	slots, slot int
	heap        bool
	thp         int // anonymous memory: 1 MADV_HUGEPAGE, -1 MADV_NOHUGEPAGE
	deadline    bool
	msgs        bool
	lowat       int // SO_RCVLOWAT in bytes; 0: the kernel's 1
	pipes       int // pipe-N
	relay       bool
}

func parseVariant(name string) (variant, error) {
	v := variant{name: name}
	switch {
	case name == "serve":
		return v, nil
	case name == "serve-seq":
		v.seq = true
		return v, nil
	case name == "serve-shm":
		v.shm = true
		return v, nil
	case strings.HasPrefix(name, "ring-"), strings.HasPrefix(name, "hot-"):
	case strings.HasPrefix(name, "pipe-"):
		return parsePipeVariant(v)
	default:
		return v, fmt.Errorf("unknown variant %q", name)
	}
	parts := strings.Split(name, "-")
	v.ring, v.hot, v.deadline, v.msgs = true, parts[0] == "hot", true, true
	var kib int
	if _, err := fmt.Sscanf(parts[1], "%dx%d", &v.slots, &kib); err != nil || v.slots < 1 || kib < 1 {
		return v, fmt.Errorf("variant %q: want %s-NxKIB", name, parts[0])
	}
	v.slot = kib << 10
	for _, p := range parts[2:] {
		switch p {
		case "heap":
			v.heap = true
		case "thp":
			v.thp = 1
		case "nothp":
			v.thp = -1
		case "nodl":
			v.deadline = false
		case "nomsg":
			v.msgs = false
		default:
			var kib int
			if _, err := fmt.Sscanf(p, "lowat%d", &kib); err == nil && kib > 0 && p == fmt.Sprintf("lowat%d", kib) {
				v.lowat = kib << 10
				continue
			}
			return v, fmt.Errorf("variant %q: unknown suffix %q", name, p)
		}
	}
	return v, nil
}

// receiver reads one transfer of size bytes from c.
type receiver func(c net.Conn, size int64) error

func (v variant) receiver() (receiver, error) {
	if v.pipes > 0 {
		return v.pipeReceiver()
	}
	if !v.ring {
		buf := make([]byte, rawBuf)
		if v.shm {
			var err error
			if buf, err = shmMap(rawBuf); err != nil {
				return nil, err
			}
		}
		for i := range buf {
			buf[i] = byte(i)
		}
		fmt.Fprintf(os.Stderr, "%s: %s\n", v.name, hugePages())
		return func(c net.Conn, size int64) error {
			off := 0
			for rem := size; rem > 0; {
				n, err := c.Read(buf[off:min(int64(off)+rem, rawBuf)])
				if err != nil {
					return err
				}
				rem -= int64(n)
				if off += n; !v.seq || off == rawBuf {
					off = 0
				}
			}
			return nil
		}, nil
	}
	mem, err := v.ringMem(v.slots * v.slot)
	if err != nil {
		return nil, err
	}
	sp, err := drainedCtrl()
	if err != nil {
		return nil, err
	}
	hot := make([]byte, 256<<10)
	msg := make([]byte, 16)
	return func(c net.Conn, size int64) error {
		r := io.Reader(c)
		if v.deadline {
			r = deadlineReader{c}
		}
		if v.lowat > 0 {
			lr, err := newLowatReader(c, r, size, v.lowat)
			if err != nil {
				return err
			}
			r = lr
		}
		for k, rem := 0, size; rem > 0; k++ {
			at := (k % v.slots) * v.slot
			buf := mem[at:][:min(rem, int64(v.slot))]
			if v.hot {
				for got := 0; got < len(buf); {
					m, err := r.Read(hot[:min(len(buf)-got, len(hot))])
					if err != nil {
						return err
					}
					got += copy(buf[got:], hot[:m])
				}
			} else if _, err := io.ReadFull(r, buf); err != nil {
				return err
			}
			if v.msgs {
				if _, err := syscall.Write(sp[0], msg); err != nil {
					return err
				}
			}
			rem -= int64(len(buf))
		}
		return nil
	}, nil
}

// ringMem is a ring's memory, in the kind of pages the variant names, faulted
// in; stderr says how much of it the kernel gave huge pages.
func (v variant) ringMem(size int) ([]byte, error) {
	var mem []byte
	var err error
	switch {
	case v.heap:
		mem = make([]byte, size)
	case v.thp != 0:
		if mem, err = syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON); err != nil {
			return nil, err
		}
		advice := unix.MADV_HUGEPAGE
		if v.thp < 0 {
			advice = unix.MADV_NOHUGEPAGE
		}
		if err := unix.Madvise(mem, advice); err != nil {
			return nil, fmt.Errorf("madvise: %w", err)
		}
	default:
		if mem, err = shmMap(size); err != nil {
			return nil, err
		}
	}
	for i := range mem {
		mem[i] = byte(i)
	}
	fmt.Fprintf(os.Stderr, "%s: %s\n", v.name, hugePages())
	return mem, nil
}

// hugePages is this process's huge page use, from /proc/self/smaps_rollup.
func hugePages() string {
	b, err := os.ReadFile("/proc/self/smaps_rollup")
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "AnonHugePages:") || strings.HasPrefix(l, "ShmemPmdMapped:") {
			out = append(out, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(out, ", ")
}

// shmMap maps size bytes of shared memory, as the host's ring.
func shmMap(size int) ([]byte, error) {
	name := fmt.Sprintf("/dev/shm/recv-bench-%d", os.Getpid())
	fd, err := syscall.Open(name, syscall.O_RDWR|syscall.O_CREAT|syscall.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	defer syscall.Close(fd)
	syscall.Unlink(name)
	if err := syscall.Ftruncate(fd, int64(size)); err != nil {
		return nil, err
	}
	return syscall.Mmap(fd, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
}

// drainedCtrl is a control socket pair whose plugin end a goroutine drains:
// the host end takes a datagram a slot, as the host's does.
func drainedCtrl() ([2]int, error) {
	sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET, 0)
	if err != nil {
		return [2]int{}, err
	}
	go func() {
		b := make([]byte, 64)
		for {
			if _, err := syscall.Read(sp[1], b); err != nil {
				return
			}
		}
	}()
	return sp, nil
}

// deadlineReader arms a read deadline before every read, as the host does.
type deadlineReader struct{ c net.Conn }

func (d deadlineReader) Read(p []byte) (int, error) {
	if err := d.c.SetReadDeadline(time.Now().Add(time.Minute)); err != nil {
		return 0, err
	}
	return d.c.Read(p)
}

// lowatReader keeps SO_RCVLOWAT at min(lowat, bytes still to come) while it
// reads a payload of known size: epoll then wakes the reader once that much
// is queued, and a tail shorter than lowat still wakes it.
type lowatReader struct {
	raw      syscall.RawConn
	r        io.Reader
	rem      int64
	cur, max int
}

// rawConn is c's socket for a variant that works on it directly (what names
// the variant, for the error).
func rawConn(c net.Conn, what string) (syscall.RawConn, error) {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil, fmt.Errorf("%s needs a socket, not %T", what, c)
	}
	return sc.SyscallConn()
}

func newLowatReader(c net.Conn, r io.Reader, size int64, lowat int) (*lowatReader, error) {
	raw, err := rawConn(c, "SO_RCVLOWAT")
	if err != nil {
		return nil, err
	}
	l := &lowatReader{raw: raw, r: r, rem: size, max: lowat}
	return l, l.set(int(min(int64(lowat), size)))
}

func (l *lowatReader) set(v int) error {
	v = max(v, 1)
	var serr error
	if err := l.raw.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVLOWAT, v)
	}); err != nil {
		return err
	}
	l.cur = v
	return serr
}

func (l *lowatReader) Read(p []byte) (int, error) {
	if int64(l.cur) > l.rem {
		if err := l.set(int(l.rem)); err != nil {
			return 0, err
		}
	}
	n, err := l.r.Read(p)
	l.rem -= int64(n)
	if l.rem <= 0 && l.cur != 1 {
		if serr := l.set(1); err == nil {
			err = serr // the next payload's header must not wait
		}
	}
	return n, err
}

// serve is a child: each transfer is an 8-byte length, then the bytes; one
// byte back when they are all in.
func serve(v variant, network, addr string) error {
	recv, err := v.receiver()
	if err != nil {
		return err
	}
	ln, err := net.Listen(network, addr)
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	// The engine's default socket buffers (4 MiB on a Unix socket).
	if err := host.SetSocketBuffers(c, 0); err != nil {
		return err
	}
	var hdr [8]byte
	for {
		if _, err := io.ReadFull(c, hdr[:]); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if err := recv(c, int64(binary.LittleEndian.Uint64(hdr[:]))); err != nil {
			return err
		}
		if _, err := c.Write([]byte{1}); err != nil {
			return err
		}
	}
}

func send(c net.Conn, f *os.File, size int64, buf []byte) (float64, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return 0, err
	}
	var hdr [8]byte
	binary.LittleEndian.PutUint64(hdr[:], uint64(size))
	start := time.Now()
	if _, err := c.Write(hdr[:]); err != nil {
		return 0, err
	}
	// sendfile on TCP; on a Unix socket through the buffer (no ReaderFrom).
	if _, err := io.CopyBuffer(c, io.LimitReader(f, size), buf); err != nil {
		return 0, err
	}
	if _, err := io.ReadFull(c, hdr[:1]); err != nil {
		return 0, err
	}
	return float64(size) / time.Since(start).Seconds() / 1e9, nil
}

func main() {
	child := flag.String("serve", "", "run as the receiving child of this variant")
	listen := flag.String("listen", "", "the child's address (-serve; the parent passes a free TCP port, or a Unix socket in its temporary directory)")
	network := flag.String("net", "tcp", "tcp or unix")
	n := flag.Int("n", 8, "transfers per variant")
	sockbuf := flag.Int("sockbuf", 0, "over a Unix socket, the SO_SNDBUF the sender asks for (0: the kernel's default, as a client that sets none)")
	list := flag.String("variants", "serve,serve-seq,ring-4x2048,ring-4x2048-heap,ring-4x2048-nodl,ring-4x2048-nomsg,hot-4x2048", "variants, comma-separated")
	flag.Parse()
	if err := run(*child, *network, *listen, *n, *sockbuf, *list, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "recv-bench:", err)
		os.Exit(1)
	}
}

func run(child, network, listen string, n, sockbuf int, list string, args []string) error {
	if network != "tcp" && network != "unix" {
		return fmt.Errorf("-net %q: want tcp or unix", network)
	}
	if child != "" {
		v, err := parseVariant(child)
		if err != nil {
			return err
		}
		if listen == "" {
			if network == "unix" {
				return errors.New("-serve -net unix needs -listen PATH")
			}
			listen = "127.0.0.1:0"
		}
		return serve(v, network, listen)
	}
	if len(args) != 1 {
		return errors.New("usage: recv-bench [-n N] [-net tcp|unix] [-variants V,...] FILE")
	}
	f, err := os.Open(args[0])
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	names := strings.Split(list, ",")
	conns := make([]net.Conn, len(names))
	pids := make([]int, len(names))
	dir, err := os.MkdirTemp("", "recv-bench")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for i, name := range names {
		if _, err := parseVariant(name); err != nil {
			return err
		}
		at := "127.0.0.1:0"
		if network == "unix" {
			at = fmt.Sprintf("%s/%d.sock", dir, i)
		}
		cmd := exec.Command(os.Args[0], "-net", network, "-listen", at, "-serve", name)
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return err
		}
		if err := cmd.Start(); err != nil {
			return err
		}
		defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
		pids[i] = cmd.Process.Pid
		var addr string
		if _, err := fmt.Fscanln(out, &addr); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if conns[i], err = net.Dial(network, addr); err != nil {
			return err
		}
		defer conns[i].Close()
		if uc, ok := conns[i].(*net.UnixConn); ok && sockbuf > 0 {
			if err := uc.SetWriteBuffer(sockbuf); err != nil {
				return err
			}
		}
	}
	res := make([][]float64, len(names))
	// CPU seconds over all of a variant's transfers: the sender's (this
	// process does nothing else meanwhile) and its receiving child's.
	sendCPU, recvCPU := make([]float64, len(names)), make([]float64, len(names))
	buf := make([]byte, 1<<20)
	for range n {
		for i := range names {
			s0 := proccpu.Self()
			r0, err := proccpu.Of(pids[i])
			if err != nil {
				return err
			}
			v, err := send(conns[i], f, st.Size(), buf)
			if err != nil {
				return fmt.Errorf("%s: %w", names[i], err)
			}
			r1, err := proccpu.Of(pids[i])
			if err != nil {
				return err
			}
			sendCPU[i] += proccpu.Self() - s0
			recvCPU[i] += r1 - r0
			res[i] = append(res[i], v)
		}
	}
	how := "TCP loopback, sendfile sender"
	if network == "unix" {
		how = "Unix socket, sender copying through a 1 MiB buffer"
		if sockbuf > 0 {
			how += fmt.Sprintf(", its SO_SNDBUF asked for %d bytes", sockbuf)
		}
	}
	fmt.Printf("%d transfers of %d bytes per variant, %s\n", n, st.Size(), how)
	base := median(res[0])
	gb := float64(n) * float64(st.Size()) / 1e9
	for i, name := range names {
		fmt.Printf("%-22s median %5.2f GB/s  ratio to %s %.2f  CPU-s/GB receiver %.3f sender %.3f  all %.2f\n",
			name, median(res[i]), names[0], median(res[i])/base, recvCPU[i]/gb, sendCPU[i]/gb, res[i])
	}
	return nil
}

func median(v []float64) float64 {
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
