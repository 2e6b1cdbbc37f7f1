package main

// The time zone database, built in: calendar limits (timezone: in
// weir.yaml) then work in a container without /usr/share/zoneinfo.
import _ "time/tzdata"
