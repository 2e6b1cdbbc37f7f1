package policy

import (
	"os"

	"github.com/weir-dev/weir/policy/config"
)

// LoadFile reads the weir.yaml at path and parses it (Parse).
func LoadFile(path string) (*config.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data, path)
}

// Parse parses and validates a weir.yaml held in data: its schema
// (config.Parse) and its rules, lists and protect rules, as New compiles
// them. filename is used in error messages. On failure the error is a
// *config.Error that lists every problem found, each with its line and
// column.
func Parse(data []byte, filename string) (*config.Config, error) {
	return config.Parse(data, filename, func(cfg *config.Config, rep config.Reporter) {
		check(cfg, positioned{rep})
	})
}
