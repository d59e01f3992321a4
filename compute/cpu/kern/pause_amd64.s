//go:build amd64

#include "textflag.h"

// func cpuPause()
//
// One PAUSE: the spin-wait hint, which lets a hyperthread sibling run while
// a pool worker polls for work.
TEXT ·cpuPause(SB), NOSPLIT, $0-0
	PAUSE
	RET
