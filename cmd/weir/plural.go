package main

import "strconv"

// count renders n with the noun that agrees with it: "1 line", "2 lines".
func count[N int | int64](n N, one, many string) string {
	if n == 1 || n == -1 {
		return strconv.FormatInt(int64(n), 10) + " " + one
	}
	return strconv.FormatInt(int64(n), 10) + " " + many
}
