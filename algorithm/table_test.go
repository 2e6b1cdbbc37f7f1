package algorithm_test

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/weir-dev/weir"
	"github.com/weir-dev/weir/algorithm"
)

// TestNamesWrittenOnce: each algorithm's name is a string literal in one
// non-test Go file of the repository, the table's; every other list of
// algorithms derives from it.
func TestNamesWrittenOnce(t *testing.T) {
	// homonyms are literals that spell a name but mean something else.
	homonyms := map[string]string{
		"../cmd/weir/bench.go":         "concurrency", // weir bench --concurrency: concurrent callers
		"../policy/config/yaml.go":     "concurrency", // a protect rule's concurrency: (requests in flight)
		"../protect/config.go":         "concurrency", // the same field's name in its errors
		"../internal/resp/commands.go": "gcra",        // the RESP command GCRA (Redis's name for it)
	}
	names := algorithm.Names()
	where := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if v, err := strconv.Unquote(lit.Value); err == nil && slices.Contains(names, v) && !slices.Contains(where[v], path) && homonyms[filepath.ToSlash(path)] != v {
					where[v] = append(where[v], path)
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if got := where[n]; len(got) != 1 || filepath.ToSlash(got[0]) != "../algorithm/table.go" {
			t.Errorf("%q is a string literal in %v, want only ../algorithm/table.go", n, got)
		}
	}
}

// TestTable: the table's lists agree with each other and with package
// weir's.
func TestTable(t *testing.T) {
	kinds := algorithm.Kinds()
	algos := weir.Algorithms()
	if len(kinds) != 7 || len(algos) != len(kinds) {
		t.Fatalf("%d kinds, %d algorithms", len(kinds), len(algos))
	}
	for i, k := range kinds {
		spec, ok := k.Spec()
		if !ok || spec.Kind != k || spec.Name != k.String() || string(algos[i]) != spec.Name {
			t.Errorf("row %d: %+v, algorithm %q", i, spec, algos[i])
		}
		if got, ok := algos[i].Kind(); !ok || got != k {
			t.Errorf("%q.Kind() = %v, %v", algos[i], got, ok)
		}
		if back, ok := algorithm.ParseKind(spec.Name); !ok || back != k {
			t.Errorf("ParseKind(%q) = %v, %v", spec.Name, back, ok)
		}
		if spec.Takes&algorithm.FieldBlock == 0 {
			t.Errorf("%s does not take block", k)
		}
	}
	if got := algorithm.Taking(algorithm.FieldBurst); !slices.Equal(got, []string{"token_bucket", "leaky_bucket", "gcra"}) {
		t.Errorf("Taking(burst) = %v", got)
	}
	if !algorithm.Concurrency.Supports(algorithm.FeatureLeases) || algorithm.GCRA.Supports(algorithm.FeatureLeases) || !algorithm.LeakyBucket.Supports(algorithm.FeatureShaping) {
		t.Error("Supports disagrees with the table")
	}
}

// TestCompileNamesTheField: Compile's error is a *FieldError naming the
// setting at fault and the problem, and weir.Limit.Compile's LimitError
// carries the field's name and the FieldError.
func TestCompileNamesTheField(t *testing.T) {
	const min = 60_000_000
	for _, c := range []struct {
		cfg     algorithm.Config
		field   algorithm.Field
		problem algorithm.Problem
	}{
		{algorithm.Config{Kind: 99, Rate: 1, Period: min}, algorithm.FieldAlgorithm, algorithm.Invalid},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 0, Period: min}, algorithm.FieldRate, algorithm.Invalid},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 1, Period: 0}, algorithm.FieldPeriod, algorithm.Invalid},
		{algorithm.Config{Kind: algorithm.FixedWindow, Rate: 5, Period: min, Burst: 3}, algorithm.FieldBurst, algorithm.NotTaken},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 5, Period: min, Block: -1}, algorithm.FieldBlock, algorithm.Invalid},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 5, Period: min, Block: algorithm.MaxPeriod + 1}, algorithm.FieldBlock, algorithm.Invalid},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 5, Period: min, MaxDelay: 1}, algorithm.FieldMaxDelay, algorithm.NotTaken},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 5, Period: min, DelayAfter: 1}, algorithm.FieldDelayAfter, algorithm.NotTaken},
		{algorithm.Config{Kind: algorithm.LeakyBucket, Rate: 5, Period: min, DelayAfter: 1}, algorithm.FieldDelayAfter, algorithm.NeedsOther},
		{algorithm.Config{Kind: algorithm.LeakyBucket, Rate: 5, Period: min, MaxDelay: 1, DelayAfter: 6}, algorithm.FieldDelayAfter, algorithm.Invalid},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 5, Period: min, Buckets: 4}, algorithm.FieldBuckets, algorithm.NotTaken},
		{algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 5, Period: min, Buckets: 61}, algorithm.FieldBuckets, algorithm.OutOfRange},
		{algorithm.Config{Kind: algorithm.SlidingWindow, Rate: 5, Period: 1_234_567, Buckets: 10}, algorithm.FieldBuckets, algorithm.NoSplit},
		{algorithm.Config{Kind: algorithm.SlidingLog, Rate: 2_000_000, Period: min}, algorithm.FieldRate, algorithm.Invalid},
		{algorithm.Config{Kind: algorithm.GCRA, Rate: 9_999_991, Period: 365 * 86400 * 1_000_000, Burst: 1_000_000}, algorithm.FieldBurst, algorithm.Invalid},
	} {
		_, err := algorithm.Compile(c.cfg)
		var fe *algorithm.FieldError
		if !errors.As(err, &fe) || fe.Field != c.field || fe.Problem != c.problem || fe.Kind != c.cfg.Kind {
			t.Errorf("%+v: got %#v (%v), want field %v, problem %d", c.cfg, fe, err, c.field, c.problem)
		}
	}
	_, err := weir.Limit{Algorithm: weir.FixedWindow, Rate: 5, Period: 60e9, Burst: 2}.Compile()
	var le *weir.LimitError
	var fe *algorithm.FieldError
	if !errors.As(err, &le) || le.Field != "burst" || !errors.As(err, &fe) || fe.Value != 2 || !errors.Is(err, weir.ErrInvalidLimit) {
		t.Fatalf("got %#v", err)
	}
}
