//go:build amd64 && goexperiment.simd

#include "textflag.h"

// func prefetch(p *byte, n int)
// Issues PREFETCHT0 for every 64-byte line of [p, p+n). Prefetches never
// fault, so any address range is safe.
TEXT ·prefetch(SB), NOSPLIT, $0-16
	MOVQ p+0(FP), AX
	MOVQ n+8(FP), CX
	ADDQ AX, CX
loop:
	CMPQ AX, CX
	JAE  done
	PREFETCHT1 (AX)
	ADDQ $64, AX
	JMP  loop
done:
	RET
