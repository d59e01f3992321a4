package cuda

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// CacheDir returns the kernel cache directory: $MOXIE_CUDA_CACHE if set,
// otherwise os.UserCacheDir()/moxie/cuda.
func CacheDir() (string, error) {
	if d := os.Getenv("MOXIE_CUDA_CACHE"); d != "" {
		return d, nil
	}
	base, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("cuda kernel cache: %w (set MOXIE_CUDA_CACHE)", err)
	}
	return filepath.Join(base, "moxie", "cuda"), nil
}

// CacheKey is the hex sha256 identifying one compiled kernel image: it covers
// the source, every compiler option (in order), the NVRTC version and the
// device's compute capability, each length-prefixed so that no two inputs
// collide by concatenation.
func CacheKey(src string, opts []string, nvrtcMajor, nvrtcMinor, ccMajor, ccMinor int) string {
	h := sha256.New()
	field := func(s string) { fmt.Fprintf(h, "%d:%s;", len(s), s) }
	field("moxie-cuda-cubin-v1")
	field(src)
	field(fmt.Sprint(len(opts)))
	for _, o := range opts {
		field(o)
	}
	field(fmt.Sprintf("nvrtc %d.%d", nvrtcMajor, nvrtcMinor))
	field(fmt.Sprintf("sm %d.%d", ccMajor, ccMinor))
	return hex.EncodeToString(h.Sum(nil))
}

var elfMagic = []byte("\x7fELF")

// readCache returns the cached image for key, or ok=false if there is none or
// it is not an ELF image (a corrupt entry is treated as a miss).
func readCache(dir, key string) (img []byte, ok bool) {
	b, err := os.ReadFile(filepath.Join(dir, key+".cubin"))
	if err != nil || !bytes.HasPrefix(b, elfMagic) {
		return nil, false
	}
	return b, true
}

// writeCache stores img under key atomically (temp file + rename).
func writeCache(dir, key string, img []byte) error {
	if strings.ContainsAny(key, `/\`) || key == "" {
		return fmt.Errorf("cuda kernel cache: bad key %q", key)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cuda kernel cache: %w", err)
	}
	f, err := os.CreateTemp(dir, key+".*.tmp")
	if err != nil {
		return fmt.Errorf("cuda kernel cache: %w", err)
	}
	_, werr := f.Write(img)
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(f.Name())
		return fmt.Errorf("cuda kernel cache: writing %s: %v %v", f.Name(), werr, cerr)
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, key+".cubin")); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("cuda kernel cache: %w", err)
	}
	return nil
}
