package mod

// Test files are not counted.
func Exported() {}
