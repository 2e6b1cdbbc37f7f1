module github.com/weir-dev/weir/examples/echo

go 1.26.0

require (
	github.com/labstack/echo/v5 v5.3.1
	github.com/weir-dev/weir v0.0.0
)

require golang.org/x/time v0.15.0 // indirect

replace github.com/weir-dev/weir => ../..
