package cudallama

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/hydra-engine/hydra-engine/iface"
)

// The pin (mk/llama-pin.mk) is one well-formed line, and a plugin built
// with llama.cpp was built from the commit it names: the streaming shim
// uses llama.cpp internals, and libggml-cuda.so must match.
func TestVersionPin(t *testing.T) {
	pin := readPin(t)
	if !regexp.MustCompile(`^node-llama-cpp@\d+\.\d+\.\d+$`).MatchString(pin.pkg) || !strings.HasPrefix(pin.integrity, "sha512-") ||
		!regexp.MustCompile(`^[0-9a-f]{40}$`).MatchString(pin.commit) {
		t.Fatalf("mk/llama-pin.mk: LLAMA_PIN %+v is not PACKAGE@VERSION sha512-… COMMIT (40 hex digits)", pin)
	}
	if Linked && llamaCommit != pin.commit {
		t.Fatalf("built from llama.cpp %s, mk/llama-pin.mk pins %s: rebuild through make (make build-llama, make test-llama)", llamaCommit, pin.commit)
	}
	if Linked && backendVersion() != Version+"+llama.cpp-"+pin.commit[:8] {
		t.Fatalf("backend version %q does not name the pinned commit %s", backendVersion(), pin.commit)
	}
}

type llamaPin struct{ pkg, integrity, commit string }

// readPin reads LLAMA_PIN from mk/llama-pin.mk.
func readPin(t *testing.T) llamaPin {
	t.Helper()
	mk, err := os.ReadFile("../../mk/llama-pin.mk")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^LLAMA_PIN := (\S+) (\S+) (\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("mk/llama-pin.mk has no line LLAMA_PIN := PACKAGE@VERSION INTEGRITY COMMIT")
	}
	return llamaPin{string(m[1]), string(m[2]), string(m[3])}
}

func TestCUDALibraryLookup(t *testing.T) {
	dir := t.TempDir()
	if _, err := cudaLibrary(dir); !errors.Is(err, errNoCUDALibrary) {
		t.Fatalf("no library: %v", err)
	}
	if err := os.WriteFile(filepath.Join(dir, CUDALibrary), []byte("ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cudaLibrary(dir); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "no version stamp") {
		t.Fatalf("no stamp: %v", err)
	}
	stamp := filepath.Join(dir, VersionStampFile)
	if err := os.WriteFile(stamp, []byte(versionStamp("v0.0.1")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := cudaLibrary(dir); !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), "v0.0.1") {
		t.Fatalf("other version: %v", err)
	}
	if err := os.WriteFile(stamp, []byte(versionStamp(llamaCommit)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if lib, err := cudaLibrary(dir); err != nil || lib != filepath.Join(dir, CUDALibrary) {
		t.Fatalf("matching stamp: %q, %v", lib, err)
	}
}

// head builds a state head: one stream, cells with the given positions.
func head(streams uint32, pos ...int32) []byte {
	b := binary.LittleEndian.AppendUint32(nil, streams)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(pos)))
	for _, p := range pos {
		b = binary.LittleEndian.AppendUint32(b, uint32(p))
		b = binary.LittleEndian.AppendUint32(b, 1)
		b = binary.LittleEndian.AppendUint32(b, 3)
	}
	return b
}

func TestReadStateHead(t *testing.T) {
	layout := plainLayout(100, 50, 0)
	toks := []int32{1, 2, 3}
	h, err := readStateHead(bytes.NewReader(head(1, 2, 0, 1)), toks, 10, 8, layout, layout.size(3))
	if err != nil || h.cells != 3 || !bytes.Equal(h.raw, head(1, 2, 0, 1)) {
		t.Fatalf("good head: %+v, %v", h, err)
	}
	h, err = readStateHead(bytes.NewReader(head(1)), nil, 10, 8, layout, emptyState)
	if err != nil || h.cells != 0 || len(h.raw) != emptyState {
		t.Fatalf("empty state: %+v, %v", h, err)
	}
	for _, tc := range []struct {
		name string
		in   []byte
		toks []int32
		size int64
		msg  string
	}{
		{"streams", head(2, 0, 1, 2), toks, 0, "2 KV streams"},
		{"fewer tokens", head(1, 0, 1, 2), toks[:2], 0, "3 cells, the blob header 2 tokens"},
		{"over n_ctx", head(1, 0, 1, 2, 3, 4, 5, 6, 7, 8), make([]int32, 9), 0, "n_ctx is 8"},
		{"token range", head(1, 0, 1, 2), []int32{1, 10, 3}, 0, "token 10 at position 1"},
		{"size", head(1, 0, 1, 2), toks, layout.size(3) - 1, "needs 250"},
		{"position range", head(1, 0, 3, 1), toks, 0, "cell 1: position 3 outside [0, 3)"},
		{"negative position", head(1, 0, -1, 1), toks, 0, "position -1"},
		{"repeat", head(1, 0, 1, 1), toks, 0, "cell 2: position 1 repeated"},
		{"seq ids", func() []byte { b := head(1, 0, 1, 2); b[8+12+4] = 2; return b }(), toks, 0, "cell 1 belongs to 2 sequences"},
		{"truncated", head(1, 0, 1, 2)[:20], toks, 0, "truncated at offset 20"},
		{"truncated header", []byte{1, 0}, toks, 0, "truncated at offset 2"},
	} {
		size := tc.size
		if size == 0 {
			size = 1 << 20
		}
		_, err := readStateHead(bytes.NewReader(tc.in), tc.toks, 10, 8, layout, size)
		if !errors.Is(err, iface.ErrBadRequest) || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: %v, want ErrBadRequest mentioning %q", tc.name, err, tc.msg)
		}
	}
	boom := errors.New("reset")
	_, err = readStateHead(io.MultiReader(bytes.NewReader(head(1, 0)[:12]), errReader{boom}), []int32{1}, 10, 8, layout, 1<<20)
	if !errors.Is(err, boom) || errors.Is(err, iface.ErrBadRequest) {
		t.Fatalf("reader error: %v", err)
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

func TestUniform(t *testing.T) {
	// The draw is a function of seed and position only.
	if uniform(7, 100) != uniform(7, 100) || uniform(7, 100) == uniform(8, 100) || uniform(7, 100) == uniform(7, 101) {
		t.Fatal("uniform")
	}
	for pos := range 1000 {
		if u := uniform(1, pos); u < 0 || u >= 1 {
			t.Fatalf("uniform %v", u)
		}
	}
}
