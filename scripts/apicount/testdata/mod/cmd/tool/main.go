// Command tool is under cmd/: not counted.
package main

func Exported() {}

func main() {}
