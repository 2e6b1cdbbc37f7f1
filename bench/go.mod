module github.com/weir-dev/weir/bench

go 1.26.0

replace github.com/weir-dev/weir => ../

require (
	github.com/redis/rueidis v1.0.79
	github.com/weir-dev/weir v0.0.0-00010101000000-000000000000
	golang.org/x/time v0.16.0
)

require (
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
