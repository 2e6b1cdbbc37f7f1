//go:build unix

package tlsfiles

import (
	"os"
	"syscall"
)

// inode returns the file's inode number: a file replaced by rename (as
// certificate rotations do) has a new one even when its modification time
// and size are the same as the old file's.
func inode(fi os.FileInfo) uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return uint64(st.Ino)
	}
	return 0
}
