package price

import (
	"fmt"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
)

// Variables are the names a cost expression may use, with what they hold.
var Variables = []struct{ Name, Doc string }{
	{"model", "the request's model (string)"},
	{"input_tokens", "input tokens, not cached"},
	{"cached_input_tokens", "input tokens read from the provider's cache"},
	{"output_tokens", "output tokens, not reasoning"},
	{"reasoning_tokens", "reasoning tokens"},
	{"cache_write_tokens", "input tokens written to the provider's cache"},
	{"input_price", "the model's input price, micro-units per million tokens"},
	{"cached_input_price", "the model's cached input price, micro-units per million tokens"},
	{"output_price", "the model's output price, micro-units per million tokens"},
	{"reasoning_price", "the model's reasoning price, micro-units per million tokens"},
	{"cache_write_price", "the model's cache write price, micro-units per million tokens"},
	{"estimate", "true when pricing the estimate taken before the response (bool)"},
}

// MaxExprLen bounds a cost expression's length.
const MaxExprLen = 2000

// maxEvalCost bounds the work of one evaluation (cel.CostLimit): a cost
// expression is arithmetic, and a comprehension that runs long fails.
const maxEvalCost = 10_000

var env = func() *cel.Env {
	opts := make([]cel.EnvOption, 0, len(Variables))
	for _, v := range Variables {
		t := cel.IntType
		switch v.Name {
		case "model":
			t = cel.StringType
		case "estimate":
			t = cel.BoolType
		}
		opts = append(opts, cel.Variable(v.Name, t))
	}
	e, err := cel.NewEnv(opts...)
	if err != nil {
		panic("price: the cost expression environment: " + err.Error())
	}
	return e
}()

// Expr is a compiled cost expression: a CEL expression of type int over
// Variables, giving micro-units (or whatever units its rule counts).
type Expr struct {
	src  string
	prog cel.Program
}

// ExprError is a problem with a cost expression, at a column of it
// (counting from 1; 0 when unknown).
type ExprError struct {
	Line, Column int
	Msg          string
}

func (e *ExprError) Error() string {
	if e.Column > 0 {
		return fmt.Sprintf("at line %d, column %d of the expression: %s", e.Line, e.Column, e.Msg)
	}
	return e.Msg
}

// Compile compiles a cost expression; its errors are *ExprError.
func Compile(src string) (*Expr, error) {
	if strings.TrimSpace(src) == "" {
		return nil, &ExprError{Msg: "the cost expression is empty"}
	}
	if len(src) > MaxExprLen {
		return nil, &ExprError{Msg: fmt.Sprintf("the cost expression is %d bytes long, more than %d", len(src), MaxExprLen)}
	}
	ast, iss := env.Compile(src)
	if iss != nil && iss.Err() != nil {
		e := iss.Errors()[0]
		msg := strings.TrimSuffix(e.Message, " (in container '')")
		if strings.HasPrefix(msg, "undeclared reference") {
			names := make([]string, len(Variables))
			for i, v := range Variables {
				names[i] = v.Name
			}
			msg += " (the variables are " + strings.Join(names, ", ") + ")"
		}
		return nil, &ExprError{Line: e.Location.Line(), Column: e.Location.Column() + 1, Msg: msg}
	}
	if !ast.OutputType().IsExactType(cel.IntType) {
		return nil, &ExprError{Msg: fmt.Sprintf("the cost expression gives %s; it must give an int (a whole number of micro-units; int(x) converts a double)", ast.OutputType())}
	}
	prog, err := env.Program(ast, cel.CostLimit(maxEvalCost))
	if err != nil {
		return nil, &ExprError{Msg: err.Error()}
	}
	return &Expr{src: src, prog: prog}, nil
}

// String returns the expression as written.
func (x *Expr) String() string { return x.src }

// Eval evaluates x for usage u at prices m; estimate says whether u is an
// estimate. A negative result, or a failed evaluation (an overflow, a
// division by zero), is an error.
func (x *Expr) Eval(m Model, u Usage, estimate bool) (int64, error) {
	out, _, err := x.prog.Eval(map[string]any{
		"model":               u.Model,
		"input_tokens":        u.Input,
		"cached_input_tokens": u.CachedInput,
		"output_tokens":       u.Output,
		"reasoning_tokens":    u.Reasoning,
		"cache_write_tokens":  u.CacheWrite,
		"input_price":         m.Input,
		"cached_input_price":  m.CachedInput,
		"output_price":        m.Output,
		"reasoning_price":     m.Reasoning,
		"cache_write_price":   m.CacheWrite,
		"estimate":            estimate,
	})
	if err != nil {
		return 0, fmt.Errorf("cost expression %q: %w", x.src, err)
	}
	n, ok := out.(types.Int)
	if !ok {
		return 0, fmt.Errorf("cost expression %q gave %v, not an int", x.src, out)
	}
	if n < 0 {
		return 0, fmt.Errorf("cost expression %q gave %d, a negative cost", x.src, int64(n))
	}
	return int64(n), nil
}
