//go:build !unix

package protect

import "time"

// defaultCPU is nil where the process's CPU time cannot be read: MaxCPU
// then never sheds unless Config.CPU is set.
var defaultCPU func() time.Duration
