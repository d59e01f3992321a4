package cuda

import "testing"

// fuseKernelNames lists every kernel fuse.go launches from the fuse module.
var fuseKernelNames = []string{"hc_split_dots", "fuse_hc_dots", "fuse_hc_finish", "fuse_hc_one", "fuse_hc_one4", "fuse_hcp_dots", "fuse_hcp_finish", "fuse_hcp_finish4", "fuse_rows"}

// TestFuseCompile compiles the fuse module (kernels/ops.cu followed by
// kernels/fuse.cu) for sm_90 (compileModuleForTest: no GPU needed, skipped
// without NVRTC) and checks that the CUBIN defines every kernel fuse.go
// launches, under its unmangled name.
func TestFuseCompile(t *testing.T) {
	requireKernels(t, compileModuleForTest(t, "fuse", FuseSource()), fuseKernelNames...)
}
