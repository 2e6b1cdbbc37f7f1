//go:build !unix

package tlsfiles

import "os"

// inode returns 0: only modification time and size identify a version.
func inode(os.FileInfo) uint64 { return 0 }
