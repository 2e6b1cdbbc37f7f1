//go:build !purego

#include "textflag.h"

// func prefetch(addr uintptr)
TEXT ·prefetch(SB), NOSPLIT|NOFRAME, $0-8
	MOVQ addr+0(FP), AX
	CMPB ·hasPrefetchW(SB), $0
	JEQ  read
	// PREFETCHW (AX), which the assembler does not know.
	BYTE $0x0F; BYTE $0x0D; BYTE $0x08
	RET
read:
	PREFETCHT0 (AX)
	RET

// func cpuPrefetchW() bool
TEXT ·cpuPrefetchW(SB), NOSPLIT, $0-1
	MOVL $0x80000000, AX
	CPUID
	CMPL AX, $0x80000001
	JB   no
	MOVL $0x80000001, AX
	CPUID
	SHRL $8, CX // PRFCHW (3DNowPrefetch)
	ANDL $1, CX
	MOVB CX, ret+0(FP)
	RET
no:
	MOVB $0, ret+0(FP)
	RET
