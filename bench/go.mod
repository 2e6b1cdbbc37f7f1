module github.com/weir-dev/weir/bench

go 1.26.0

replace github.com/weir-dev/weir => ../

require (
	github.com/redis/rueidis v1.0.79
	github.com/weir-dev/weir v0.0.0-00010101000000-000000000000
	golang.org/x/time v0.16.0
)

require (
	cel.dev/expr v0.25.3 // indirect
	github.com/antlr4-go/antlr/v4 v4.13.1 // indirect
	github.com/fsnotify/fsnotify v1.10.1 // indirect
	github.com/google/cel-go v0.31.0 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
	golang.org/x/exp v0.0.0-20260908205506-85c1c2202aba // indirect
	golang.org/x/sys v0.48.0 // indirect
	google.golang.org/genproto/googleapis/api v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260928230214-8a89bd6388cc // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
