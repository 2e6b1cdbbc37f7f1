//go:build !purego

#include "textflag.h"

// func prefetchShard(shard, slot uintptr)
TEXT ·prefetchShard(SB), NOSPLIT|NOFRAME, $0-16
	MOVD shard+0(FP), R0
	MOVD slot+8(FP), R1
	MOVD $·shardLines(SB), R2
	MOVD 0(R2), R3
	ADD  R0, R3, R3
	PRFM (R3), PSTL1KEEP
	MOVD 8(R2), R3
	ADD  R0, R3, R3
	PRFM (R3), PSTL1KEEP
	MOVD 16(R2), R3
	ADD  R0, R3, R3
	PRFM (R3), PLDL1KEEP
	MOVD 24(R2), R3
	ADD  R0, R3, R3
	PRFM (R3), PLDL1KEEP
	PRFM (R1), PSTL1KEEP
	RET
