//go:build !purego

#include "textflag.h"

// PREFETCHW (reg), which the assembler does not know: 0F 0D /1.
#define PREFETCHW_AX BYTE $0x0F; BYTE $0x0D; BYTE $0x08
#define PREFETCHW_CX BYTE $0x0F; BYTE $0x0D; BYTE $0x09
#define PREFETCHW_DI BYTE $0x0F; BYTE $0x0D; BYTE $0x0F

// func prefetchShard(shard, slot uintptr)
TEXT ·prefetchShard(SB), NOSPLIT|NOFRAME, $0-16
	MOVQ shard+0(FP), AX
	MOVQ slot+8(FP), DI
	MOVQ ·shardLines+8(SB), CX
	ADDQ AX, CX
	MOVQ ·shardLines+16(SB), DX
	ADDQ AX, DX
	MOVQ ·shardLines+24(SB), SI
	ADDQ AX, SI
	ADDQ ·shardLines+0(SB), AX
	CMPB ·hasPrefetchW(SB), $0
	JEQ  read
	PREFETCHW_AX
	PREFETCHW_CX
	PREFETCHT0 (DX)
	PREFETCHT0 (SI)
	PREFETCHW_DI
	RET
read:
	PREFETCHT0 (AX)
	PREFETCHT0 (CX)
	PREFETCHT0 (DX)
	PREFETCHT0 (SI)
	PREFETCHT0 (DI)
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
