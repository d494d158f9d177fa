package iface

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// FileIdentity is the identity of a model file, as every backend reports it:
// alias (given, else the file name without its extension), the hex SHA-256
// of the file, computed once at load and cancellable (models are GBs), and
// the absolute path.
func FileIdentity(ctx context.Context, path, alias string) (ModelIdentity, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return ModelIdentity{}, err
	}
	f, err := os.Open(abs)
	if err != nil {
		return ModelIdentity{}, err
	}
	defer f.Close()
	if st, err := f.Stat(); err != nil {
		return ModelIdentity{}, err
	} else if !st.Mode().IsRegular() {
		return ModelIdentity{}, fmt.Errorf("%s is not a regular file", abs)
	}
	h := sha256.New()
	if _, err := io.Copy(h, ctxReader{ctx, f}); err != nil {
		return ModelIdentity{}, fmt.Errorf("hashing %s: %w", abs, err)
	}
	if alias == "" {
		base := filepath.Base(abs)
		alias = strings.TrimSuffix(base, filepath.Ext(base))
	}
	return ModelIdentity{Alias: alias, Hash: hex.EncodeToString(h.Sum(nil)), Path: abs}, nil
}

// ctxReader stops a long read on cancellation.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
